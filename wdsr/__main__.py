import sys

from wdsr.tools.cli import main

sys.exit(main())
