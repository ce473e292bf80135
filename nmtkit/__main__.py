from nmtkit.cli import main

main()
