from multispec.cli import main

main()
