"""`specc serve ENGINE [--host H] [--port P]`: load the engine, then run uvicorn."""

from __future__ import annotations

import sys

from specc.errors import UsageError


def serve(args) -> int:
    try:
        import fastapi  # noqa: F401
        import uvicorn
    except ImportError as exc:
        raise UsageError(f"`specc serve` needs FastAPI and uvicorn ({exc.name} is missing); "
                         f"install them with: pip install 'specc[serve]'") from None
    from specc.engine.loaded import load_engine
    from specc.serve.app import create_app

    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port {args.port} must be between 0 and 65535")
    if args.max_queue < 1:
        raise UsageError(f"--max-queue {args.max_queue} must be at least 1")
    engine = load_engine(args.engine, args.backend, args.device, args.settings)
    name = args.model_name or args.engine.resolve().name
    url = f"http://{args.host}:{args.port}"

    def started() -> None:
        print(f"specc: serving {args.engine} as model {name!r} ({engine.method.name}) at {url}/v1 "
              f"(Ctrl-C stops)", file=sys.stderr, flush=True)

    app = create_app(engine, name, args.max_queue, on_startup=started, reuse_prefix=not args.no_prefix_reuse)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="info" if args.verbose else "warning",
                            access_log=args.verbose, timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    server.run()
    if not server.started:
        raise UsageError(f"could not listen on {args.host}:{args.port} (in use, or not allowed); "
                         f"pick another --port or --host")
    return 0
