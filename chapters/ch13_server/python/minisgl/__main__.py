"""``python -m minisgl --model PATH``: serve the model over HTTP. A model path that cannot be
served ends it at once, in one line."""

import sys

from minisgl.models.register import MODELS
from minisgl.server import launch_server, parse_args
from minisgl.utils.hf import check_model_dir

args = parse_args(sys.argv[1:])
if args.shell:
    sys.exit("minisgl: --shell arrives in chapter 14; run without it to start the HTTP server")
try:  # before any process starts; the line names the path and the command that fixes it
    check_model_dir(args.model_path, MODELS.names())
except (OSError, ValueError) as e:
    sys.exit(f"minisgl: {e}")
launch_server(args)
