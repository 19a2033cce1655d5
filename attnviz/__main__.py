"""``python -m attnviz``: the ``attnviz`` command (:mod:`attnviz.app.command`), for an environment without its
script on the path."""

import sys

from attnviz.app.command import main

sys.exit(main())
