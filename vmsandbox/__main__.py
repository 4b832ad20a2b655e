from vmsandbox.cli import main

main()
