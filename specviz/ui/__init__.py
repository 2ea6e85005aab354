"""The Gradio app: `app.build_demo()` declares the page, one module per tab, then `app.py` launches it.

    app           build_demo (the page), launch_options, configure_torch, configure_allocator, warm_up
    common        the one queue, hosted-mode limits, drafter controls, `streaming` (handlers that stop)
    budget        what a hosted request costs in tokens, counted before any decoding
    style         stylesheet, theme, Large text / Light-dark scripts
    run_tab       speculative decoding racing plain decoding, live
    compare_tab   2-4 configurations or a k sweep on one prompt; export
    teach_tab     one cycle at a time, every number shown
    explain_tab   the method and its theory, filled with the last run's numbers
    replay_tab    a recorded run played back through the Run tab's views, no model needed
    shared_run    a class at once: the place in line, a shared race's views, a labelled replay
    tools         the API's and MCP server's tools: race, compare, load sweep, read a recording

Every model-running event but Run joins one queue (`CONCURRENCY_ID`, one at a time); Run requests
start at once and their races wait for a slot of `runs.shared_race` (one per core on a CPU). Every
event validates its inputs with `settings.validate` against the local or hosted limits before any
work. The events a user may call through "Use via API" are named `run`, `compare`, `sweep`, `load`,
`teach` and `export`, and the tools `race_speculative_decoding`, `compare_configurations`,
`load_sweep` and `read_recording`; the others are private. This package only re-exports; no module of it imports it.
"""

from .app import build_demo, configure_allocator, configure_torch, launch_options, warm_up

__all__ = ["build_demo", "configure_allocator", "configure_torch", "launch_options", "warm_up"]
