"""``python -m minisgl --model PATH``: serve the model over HTTP."""

import sys

from minisgl.server import launch_server, parse_args

args = parse_args(sys.argv[1:])
if args.shell:
    sys.exit("minisgl: --shell arrives in chapter 14; run without it to start the HTTP server")
launch_server(args)
