"""``python -m minisgl --model PATH``: serve the model over HTTP; with ``--shell``, chat with it in
the terminal instead. A model path that cannot be served ends it at once, in one line."""

import sys

from minisgl.models.register import MODELS
from minisgl.server import launch_server, parse_args
from minisgl.shell import run_shell
from minisgl.utils.hf import check_model_dir

args = parse_args(sys.argv[1:])
try:  # before any process starts; the line names the path and the command that fixes it
    check_model_dir(args.model_path, MODELS.names())
except (OSError, ValueError) as e:
    sys.exit(f"minisgl: {e}")
if args.shell:
    run_shell(args)
else:
    launch_server(args)
