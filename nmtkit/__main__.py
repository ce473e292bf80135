from nmtkit.cli import program

program()
