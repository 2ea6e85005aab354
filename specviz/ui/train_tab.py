"""The Train tab (local runs only; a hosted demo does not show it): train a draft head for a target
from the target's own text (runs.train_draft), with the loss and the held-out agreement drawn after
every epoch. The head it writes is a drafter like any other: 'head:DIR' in the Run tab's draft
model box races it against plain decoding."""

from __future__ import annotations

from pathlib import Path

import gradio as gr

from ..catalog import (HUMAN_PROMPTS_FILE, MAX_TRAINING_PROMPTS, TRAIN_PROMPTS_FILE, preset_prompt_sets,
                       read_prompt_file)
from ..errors import SpecvizError
from ..runs import Loader
from ..runs.train_draft import TrainOptions, train_head
from ..settings import LOCAL, RunSettings, validate
from ..views.charts import training_figure, waiting
from .common import CONCURRENCY_ID, DRAFT_MODEL, error_html
from .load_engine import VLLM

TRAINING_PROMPTS = "training prompts (chat; none from the benchmark or the examples)"
HUMAN_PROMPTS = "messages as people type them (written for specviz; none from the benchmark)"
PROMPT_FILES = {TRAINING_PROMPTS: TRAIN_PROMPTS_FILE, HUMAN_PROMPTS: HUMAN_PROMPTS_FILE}


def prompts_for(choice: str) -> list[str]:
    if choice in PROMPT_FILES:
        return [p.prompt for p in read_prompt_file(PROMPT_FILES[choice], MAX_TRAINING_PROMPTS)]
    sets = preset_prompt_sets()
    if choice not in sets:
        raise SpecvizError(f"No prompt set {choice!r}.")
    return [p.prompt for p in sets[choice]]


# After the fields are filled in, the Run tab's own Run button starts the race (the one run path);
# the Load tab's own Run button starts the sweep on vLLM.
RACE_JS = "() => { setTimeout(() => document.querySelector('#run').click(), 300); }"
SWEEP_JS = "() => { setTimeout(() => document.querySelector('#load-run').click(), 500); }"
SWEEP_BATCHES = "1,2,4"


def build_train_tab(*, loader: Loader, run_tab=None, tabs: gr.Tabs | None = None, load_tab=None) -> None:
    """The tab; with the Run tab's `RunTab` and the `tabs`, a finished head is raced in one click, and
    with the Load tab's `LoadTab` swept on vLLM in another (the same folder, method eagle3)."""
    gr.Markdown("Train an **EAGLE-3 draft head** for a target from the target's own text: the target writes "
                "its continuations of the prompts, its hidden states at a low, a middle and a high layer are "
                "collected, and a one-layer head learns to draft the next tokens from them, three steps deep. "
                "The head is saved after every epoch in the speculators format (the same folder serves on vLLM "
                "as `{\"method\": \"eagle3\", \"model\": FOLDER}`); when training ends, one click races it "
                "in the Run tab (or type `head:FOLDER` there as the draft model).")
    with gr.Row():
        target = gr.Textbox("", label="Target (empty: the built-in SmolLM2-135M-Instruct)", elem_id="train-target")
        prompt_set = gr.Dropdown([*PROMPT_FILES, *preset_prompt_sets()], value=TRAINING_PROMPTS,
                                 label="Prompts", elem_id="train-prompts")
        start = gr.Textbox("", label="Start from (empty: a new head; head: the shipped one; head:FOLDER)",
                           elem_id="train-start")
        folder = gr.Textbox("heads/mine", label="Save to folder", elem_id="train-out")
    with gr.Row():
        tokens = gr.Slider(2_000, 200_000, value=20_000, step=1_000, label="Tokens for the target to write",
                           elem_id="train-tokens")
        minutes = gr.Slider(1, 120, value=15, step=1, label="Minutes (writing takes at most half)",
                            elem_id="train-minutes")
        epochs = gr.Slider(1, 40, value=12, step=1, label="Epochs", elem_id="train-epochs")
    with gr.Row():
        train = gr.Button("Train", variant="primary", elem_id="train")
        race = gr.Button("Race this head against plain decoding", visible=False, elem_id="train-race")
        sweep = gr.Button("Sweep this head on vLLM (Load tab)", visible=False, elem_id="train-sweep")
    status = gr.HTML(elem_id="train-status")
    trained = gr.State(None)          # the finished head: (target text, 'head:DIR', its k)
    chart = gr.Plot(waiting(training_figure([]), "the loss and the agreement appear after each epoch"),
                    elem_id="train-chart")

    def run(target_text, choice, start_text, out, n_tokens, n_minutes, n_epochs):
        try:
            settings = validate(RunSettings(target=target_text.strip() or None, draft="ngram"), LOCAL)
            prompts = prompts_for(choice)
            if not str(out).strip():
                raise SpecvizError("Name a folder to save the head to.")
            yield "Loading the target ...", gr.skip(), gr.update(visible=False), gr.update(visible=False), None
            pair = loader(settings, None)
            options = TrainOptions(tokens=int(n_tokens), minutes=float(n_minutes), epochs=int(n_epochs))
            folder_text = str(out).strip()
            progress = None
            for progress in train_head(pair.target, pair.tokenizer, prompts, Path(folder_text),
                                       target_name=pair.target_name, eos=pair.eos_token_ids, options=options,
                                       start=start_text.strip() or None):
                figure = training_figure(progress.history, progress.baseline) if progress.history else gr.skip()
                yield f"<b>{progress.stage}</b> ({progress.fraction:.0%}): {progress.message}", figure, gr.skip(), \
                    gr.skip(), gr.skip()
            head = (target_text.strip(), f"head:{folder_text}", progress.k)
            # The Load tab sweeps the built-in target: a head for another target is swept from the command line.
            sweepable = load_tab is not None and not target_text.strip()
            yield (f"Done: {progress.message}. Race it with the button above, or in the Run tab: drafter "
                   f"<i>Draft model</i>, <code>head:{folder_text}</code>. On vLLM (method eagle3)"
                   + (", the Load tab with the second button, or" if sweepable else "") +
                   f": <code>python -m specviz load --engine vllm --draft head:{folder_text} --k 0,{progress.k}"
                   f"{' --target ' + target_text.strip() if target_text.strip() else ''}</code>."), \
                gr.skip(), gr.update(visible=run_tab is not None), gr.update(visible=sweepable), head
        except SpecvizError as error:
            yield error_html(str(error)), gr.skip(), gr.skip(), gr.skip(), gr.skip()

    train.click(run, [target, prompt_set, start, folder, tokens, minutes, epochs],
                [status, chart, race, sweep, trained], concurrency_id=CONCURRENCY_ID, api_visibility="private")
    if load_tab is not None and tabs is not None:
        def fill_load(head):
            if not head:
                return [gr.skip()] * 6
            _, spec, k = head
            return (DRAFT_MODEL, gr.update(value=spec, visible=True), SWEEP_BATCHES, f"0,{k}", VLLM,
                    gr.Tabs(selected="load-tab"))

        sweep.click(fill_load, trained, [*load_tab.settings, tabs], queue=False, api_visibility="private").then(
            None, js=SWEEP_JS, api_visibility="private")
    if run_tab is not None and tabs is not None:
        def fill(head):
            if not head:
                return [gr.skip()] * 5
            target_text, spec, k = head
            return target_text, DRAFT_MODEL, gr.update(value=spec, visible=True), k, gr.Tabs(selected="run-tab")

        race.click(fill, trained, [*run_tab.pair, tabs], queue=False, api_visibility="private").then(
            None, js=RACE_JS, api_visibility="private")
