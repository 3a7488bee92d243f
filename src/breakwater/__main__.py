from breakwater.cli import run

run()
