from tunesvc.cli import main

main()
