import sys

from breakwater.cli import main

sys.exit(main())
