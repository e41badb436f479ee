import sys

from zephon_stream.cli import main

sys.exit(main())
