from vmsandbox.cli.app import main

main()
