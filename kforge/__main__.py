from kforge.cli.app import main

main()
