from kernelab.cli import main

main()
