"""A specviz app on tiny in-process models, for the API and cancellation tests: `python
tests/serve_tiny.py [slow] [long]` on GRADIO_SERVER_PORT (conftest.running_app(tiny=True) starts it).
Hosted mode: every allowed target name runs the tiny target.
`slow` uses a wider target (about 20-40 ms a token on one thread) so that a run lasts seconds;
`long` one with a 2,048-token context, so that prompts can reach the hosted cap (the soak test)."""

import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from conftest import make_llama  # noqa: E402
from tiny_pair import WORDS, TinyModels  # noqa: E402

from specviz.ui import build_demo, configure_allocator, configure_torch, launch_options  # noqa: E402


def main() -> None:
    slow, long = "slow" in sys.argv[1:], "long" in sys.argv[1:]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    configure_torch()
    logging.getLogger("specviz.ui").info(configure_allocator())     # as app.py serves
    tiny = TinyModels()
    if slow:
        tiny.target = make_llama(0, layers=8, vocab=len(WORDS), hidden=1024)
    if long:
        tiny.target = make_llama(0, layers=4, vocab=len(WORDS), context=2048)

    def loader(settings, progress=None):
        return tiny.pair(None, settings.draft, progress)

    demo = build_demo(loader=loader, hosted=True)
    demo.launch(prevent_thread_lock=False, **launch_options(hosted=True))   # GRADIO_SERVER_NAME/_PORT


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
