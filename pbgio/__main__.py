from pbgio.cli.app import main

main()
