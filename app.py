"""specviz in the browser: `python app.py`, then open the address it prints.

Runs on the built-in SmolLM2-135M-Instruct with no hub access; presets and typed model ids need
the hub. GRADIO_SERVER_PORT picks the port, SPECVIZ_HOSTED=1 turns on the public-demo limits,
SPECVIZ_THREADS sets torch's CPU threads (default on a CPU: 1, for a clock other work cannot inflate).
"""

import logging

from specviz.ui import build_demo, configure_allocator, configure_torch, launch_options, warm_up

demo = build_demo()

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("specviz.ui").info(configure_torch())
    logging.getLogger("specviz.ui").info(configure_allocator())
    warm_up()
    demo.launch(**launch_options())
