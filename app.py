"""The speculative-decoding chat app: `python app.py [--preset NAME] [--share --auth USER:PASSWORD]`.

The command line and the launch only: the UI is the specdec_app package (layout, events, the
reply loop, rendering, the speedup), the engine and the models are specdec_core's, and the
OpenAI-compatible API (specdec_core.serve) is mounted on the same server.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import os
import sys
from typing import NoReturn

import gradio as gr

from specdec_app import build_ui
from specdec_core.presets.config import MODEL_FLAGS, config_with_models, load_presets, menu_label
from specdec_core.presets.holder import ModelHolder
from specdec_core.presets.loading import load_preset
from specdec_core.serve import API_KEY_ENV, ApiAccess, access_for, api_routes, is_loopback

AUTH_ENV = "SPECDEC_AUTH"
RISK_FLAG = "--insecure-no-auth"  # serve a network-reachable app without a login, knowingly


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Chat with a local model; watch speculative decoding work.")
    parser.add_argument("--preset", default="auto", help="preset name from models.yaml, or auto (default)")
    parser.add_argument("--config", default=None, help="a models.yaml of your own")
    for key, help_text in MODEL_FLAGS.items():
        parser.add_argument(f"--{key}", help=help_text)
    parser.add_argument("--host", default="127.0.0.1", help="address to serve on (0.0.0.0: the whole network)")
    parser.add_argument("--port", type=int, default=7860)
    parser.add_argument("--share", action="store_true", help="also make a public gradio.live link")
    parser.add_argument("--auth", default=os.environ.get(AUTH_ENV),
                        help=f"USER:PASSWORD login in front of the app (or set {AUTH_ENV})")
    parser.add_argument("--api-key", default=os.environ.get(API_KEY_ENV),
                        help="key the OpenAI-compatible API at /v1 requires as 'Authorization: Bearer KEY' "
                             f"(or set {API_KEY_ENV}); without one the API is open on 127.0.0.1 and off "
                             "when the server is reachable from elsewhere (--share, another --host)")
    parser.add_argument("--allowed-origins", default="",
                        help="comma-separated web page origins besides the app's own that may call the API "
                             "from a browser, e.g. http://localhost:3000 (others get 403)")
    parser.add_argument(RISK_FLAG, action="store_true",
                        help="serve without --auth although the app is reachable from other machines "
                             "(--share, a non-loopback --host): anyone who reaches it can generate")
    parser.add_argument("--max-new-tokens", type=int, default=256,
                        help="starting value of the slider, and the API's default max_tokens")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                        help="compiled decoding steps, compiled while the models load (default: "
                             "the preset's `compile`; auto = on with CUDA, and on CPU a 4-bit "
                             "target's steps in the background while replies start eagerly)")
    args = parser.parse_args(argv)
    if args.auth is not None:
        user, colon, password = args.auth.partition(":")
        if not (colon and user and password):  # never echo the value: it may hold a password
            _refuse("--auth takes USER:PASSWORD, both non-empty")
    if args.max_new_tokens < 1:
        parser.error("--max-new-tokens must be at least 1")
    reachable = reachable_from(args.host, args.share)
    if reachable and not args.auth and not args.insecure_no_auth:
        _refuse(f"{reachable} without --auth would let anyone who reaches it generate on this machine: add "
                f"--auth USER:PASSWORD (or set {AUTH_ENV}), or pass {RISK_FLAG} to accept that")
    args.allowed_origins = [o for o in args.allowed_origins.split(",") if o.strip()]
    return args


def _refuse(message: str) -> NoReturn:
    """A bad command line: one line on stderr and exit status 2, before anything loads."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def reachable_from(host: str, share: bool) -> str:
    """What makes the app reachable from other machines ("" if only this one can)."""
    reasons = ([f"--host {host}"] if not is_loopback(host) else []) + (["--share"] if share else [])
    return " and ".join(reasons)


def exposure_line(args: argparse.Namespace, share_url: str | None) -> str:
    """The launch line on who can use the app and Gradio's API ("" when only this machine can)."""
    where = " and ".join(([f"the network at {args.host}:{args.port}"] if not is_loopback(args.host) else [])
                         + ([f"the public link {share_url}"] if share_url else []))
    if not where:
        return ""
    if args.auth:
        return f"App and Gradio's API (/gradio_api) reachable from {where}, behind the --auth login."
    return (f"Warning ({RISK_FLAG}): anyone who reaches {where} can chat and generate through the app and "
            "Gradio's API (/gradio_api), no login.")


def launch(demo: gr.Blocks, args: argparse.Namespace, api: list | None = None,
           access: ApiAccess | None = None) -> None:
    """Serve until interrupted, with the API's routes on the same server. A failed share link
    is one line; the app keeps serving locally."""
    auth = tuple(args.auth.split(":", 1)) if args.auth else None
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):  # gradio explains a failed share link in ten lines
        demo.launch(server_name=args.host, server_port=args.port, share=args.share, auth=auth,
                    prevent_thread_lock=True, app_kwargs={"routes": list(api or [])})
    launch_text = printed.getvalue()
    if args.share and not demo.share_url:
        launch_text = launch_text.split("\nCould not create share link")[0].rstrip() + "\n"
        launch_text += (f"Could not create a share link (no network or tunnel blocked); "
                        f"still serving locally at {demo.local_url}\n")
    exposure = exposure_line(args, demo.share_url)
    if exposure:
        launch_text += exposure + "\n"
    if access is not None:
        launch_text += access.launch_line(demo.local_url) + "\n"
    print(launch_text, end="", flush=True)
    demo.block_thread()


def load_and_tell(name: str, config, compile: bool | str | None = None):
    """Load a preset (at the first page view, or a pick in the menu) and say in the terminal what
    was loaded: the preset, one line per model, and the notes (as the CLI's generate does)."""
    models = load_preset(name, config, compile=compile)
    print(f"preset: {menu_label(models.preset)}", *models.notes, models.describe(), sep="\n", file=sys.stderr,
          flush=True)
    return models


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        # the models.yaml's presets, plus the custom one --target (--draft, --eagle) names
        config, preset = config_with_models(args.config, args.preset, {key: getattr(args, key) for key in MODEL_FLAGS})
        holder = ModelHolder(config, loader=functools.partial(load_and_tell, compile=args.compile), start_preset=preset)
        demo = build_ui(preset, config, args.max_new_tokens, holder=holder)
        access = access_for(args.host, args.share, args.api_key, args.allowed_origins)
        api = api_routes(holder, load_presets(config), access, args.max_new_tokens)
    except (ValueError, FileNotFoundError) as error:  # ConfigError is a ValueError
        print(f"error: {error}", file=sys.stderr)
        return 2
    launch(demo, args, api, access)
    return 0


if __name__ == "__main__":
    sys.exit(main())
