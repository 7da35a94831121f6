import sys

from wdsr.cli import main

sys.exit(main())
