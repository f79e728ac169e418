from blazar.entry import main

main()
