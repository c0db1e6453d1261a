import sys

from cslb.cli import main

sys.exit(main())
