"""What each command does, from the options cli.py built: one module a command, holding its
tp=1 body and, where the command takes ``--tp N``, what every rank runs. A command returns
its exit status. Heavy imports wait inside the functions, so a command loads only what it runs."""

from eaglet.commands import bench, data, doctor, draft, generate, serve, train

COMMANDS = {"generate": generate.run, "bench": bench.run, "data regenerate": data.regenerate,
            "data capture": data.capture, "train": train.run, "draft import": draft.import_,
            "doctor": doctor.run, "serve": serve.run}
