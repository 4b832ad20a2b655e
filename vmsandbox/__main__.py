from vmsandbox.cli.main import main

main()
