from pbgio.cli import main

main()
