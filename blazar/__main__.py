from blazar.cli import main

main()
