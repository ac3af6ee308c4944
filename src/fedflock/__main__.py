from fedflock.cli import main

main()
