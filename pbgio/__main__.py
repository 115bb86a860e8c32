from pbgio.cli.commands import main

main()
