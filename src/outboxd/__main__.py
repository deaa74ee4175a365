from outboxd.cli import main

main()
