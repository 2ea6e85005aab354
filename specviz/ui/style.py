"""The app's look, in one place: the stylesheet (the token view's from `views.render`, then the
app's and the tabs'), the theme, the two small scripts behind Large text and Light / dark, and the
page's one script (`HEAD`): a click, a tap or Enter on a token pins its details; space runs or stops,
the arrow keys step cycles (`KEYS_NOTE`).

The first screen is the demo: a compact header, the prompt band with Run, the two token views at a
fixed height (they scroll inside, the head script keeps the latest tokens in sight, so nothing below
moves while they fill),
the summary's large speedup under them. Below 700 px the header and the token views stack."""

from __future__ import annotations

import gradio as gr

from ..views import render

# Gradio adds a copy of every rule scoped under `.gradio-container .contain`, which outranks a plain
# `body.sv-large ...` rule: Large text's overrides say !important.
CSS = render.CSS + """
#sv-header { align-items: center; gap: 8px 16px; flex-wrap: wrap; }
#sv-title { flex: 1 1 420px; }
#sv-title h1 { margin: 0; font-size: 1.5em; overflow-wrap: normal; word-break: normal; hyphens: none; }
#sv-title p { margin: 2px 0 0; font-size: 0.9em; opacity: 0.85; }
#large-text, #dark-toggle { flex: 0 0 auto !important; width: auto !important; align-self: center; }
#large-text { padding: 4px 8px; }
body.sv-large #sv-title p { display: none !important; }
body.sv-large #prompt textarea { max-height: 3.4em !important; }
#settings, #examples-panel { padding-top: 6px; padding-bottom: 6px; }
.sv-band, .sv-actions { align-items: flex-start; }
.sv-actions { gap: 8px; }
.sv-actions button { min-height: 42px; }
/* "Measure again" as tall as the buttons beside it, not a box of its own (it wrapped to a taller row) */
#fresh { align-self: center; padding: 0 6px !important; min-height: 0 !important; line-height: 1.15; }
#fresh label { margin: 0 !important; padding: 0 !important; }
.sv-race { gap: 8px; margin-top: -6px; }
.sv-race > * { min-width: 0; display: flex; flex-direction: column; }
/* the two panels as tall as each other (Gradio's wrappers of gr.HTML: .html-container, then .prose) */
.sv-race .html-container, .sv-race .prose { flex: 1 1 auto; display: flex; flex-direction: column; }
.sv-race .prose > .sv-panel { flex: 1 1 auto; }
.sv-race .sv-text { height: 9.5em; max-height: none; line-height: 1.75; }
.sv-race .sv-legend { font-size: 0.8em; margin: 0 0 4px; }
.sv-race .sv-panel { padding: 6px 10px; box-sizing: border-box; }
.sv-race .sv-panel-head { margin-bottom: 2px; }
body.sv-large .sv-race .sv-text { height: 3.5em !important; }
/* on a projector the legend keeps the verdicts (two lines): the cycle mark is seen in the text itself */
body.sv-large .sv-race .sv-legend-item:has(.sv-cycle-sample) { display: none !important; }
body.sv-large .sv-tile { padding: 0 8px !important; }
body.sv-large .sv-tile-value { font-size: 1.4em !important; }
body.sv-large .sv-tile-speedup .sv-tile-value { font-size: 1.8em !important; }
body.sv-large .sv-tile-caption { font-size: 0.75em !important; }
body.sv-large .sv-race .sv-legend { font-size: 0.68em !important; margin: 0 !important; }
body.sv-large .sv-race .sv-panel-head { font-size: 0.85em !important; margin: 0 !important; }
/* Presenter view (a 1280x720 projector): no settings, no subtitle, the two token panes and the speedup large. */
#presenter { flex: 0 0 auto !important; width: auto !important; align-self: center; padding: 4px 8px; }
body.sv-presenter #sv-title p, body.sv-presenter #settings, body.sv-presenter #teach-settings,
body.sv-presenter #sv-keys { display: none !important; }
body.sv-presenter #prompt textarea { max-height: 2.6em !important; }
body.sv-presenter .sv-race .sv-text { height: 9em !important; font-size: 1.35em !important;
  line-height: 1.6 !important; }
body.sv-presenter .sv-race .sv-panel-head { font-size: 1.1em !important; }
body.sv-presenter .sv-tile-speedup .sv-tile-value { font-size: 3.2em !important; }
body.sv-presenter .sv-tile-value { font-size: 1.9em !important; }
.sv-tok:focus-visible, .sv-tok.sv-pinned { outline: 3px solid #0072B2; outline-offset: 1px; }
#sv-pin { position: absolute; z-index: 1000; max-width: min(360px, calc(100vw - 16px)); padding: 8px 30px 8px 10px;
  border-radius: 8px; border: 2px solid #0072B2; background: #fff; color: #111; font-size: 15px; line-height: 1.4;
  white-space: pre-line; box-shadow: 0 4px 16px rgba(0,0,0,0.25); }
#sv-pin button { position: absolute; top: 2px; right: 4px; border: none; background: none; font-size: 18px;
  cursor: pointer; color: inherit; }
body.sv-large #sv-pin { font-size: 19px !important; }
.dark #sv-pin { background: #1f2937; color: #f3f4f6; border-color: #56B4E9; }
.dark input[type=radio], .dark input[type=checkbox] { border: 2px solid #cbd5e1 !important; }
.dark input[type=radio]:not(:checked), .dark input[type=checkbox]:not(:checked) {
  background-color: #0f172a !important; }
@media (max-width: 700px) {
  #sv-header { flex-direction: row; }
  #sv-title { flex: 1 1 100% !important; }
  #sv-title h1 { font-size: 1.25em; }
  #sv-title p { display: none; }
  .sv-race { flex-direction: column; }
  .sv-race .sv-text { height: 8em; }
  .sv-band { flex-direction: column; align-items: stretch; }
  .sv-race .sv-legend { font-size: 0.72em; gap: 0 10px; }
  /* five short tab names fit in a row once their padding shrinks (Gradio measures them, then hides
     the ones that do not fit behind "...") */
  #tabs .tab-container button { padding: 4px 7px; font-size: 0.95em; }
}
#examples .sv-example, #examples button { font-size: var(--text-sm); }
.sv-stopped { border: 2px solid #E69F00; border-radius: 8px; padding: 6px 10px; margin-bottom: 6px; }
.sv-parted { border: 2px solid #D55E00; border-radius: 8px; padding: 6px 10px; margin-bottom: 6px; font-weight: 600; }
.sv-state { opacity: 0.8; }
.dark .js-plotly-plot .main-svg text { fill: #e4e4e7 !important; }
.dark .js-plotly-plot .main-svg .gridlayer path { stroke: rgba(200,200,200,0.2) !important; }
.dark .js-plotly-plot .hoverlayer text { fill: #222 !important; }
body.sv-large .gradio-container { zoom: 1.25; }
body.sv-large .sv-text { font-size: 1.2em !important; }
.sv-teach table { font-size: 0.95em; }
.sv-teach code, .sv-compare code { font-family: var(--font-mono, ui-monospace, monospace); }
.sv-id { opacity: 0.6; font-size: 0.85em; }
.sv-cycle.sv-current { outline: 2px solid #0072B2; outline-offset: 2px; border-radius: 3px; }
.sv-teach tr.sv-current-row { outline: 2px solid #0072B2; outline-offset: -2px; }
.sv-not-yet { opacity: 0.6; font-style: italic; }
.sv-unchecked { border: 1px dashed rgba(128,128,128,0.8); border-radius: 3px; padding: 0 3px; font-style: italic;
  opacity: 0.8; }
.sv-prompt { opacity: 0.7; }
.sv-explain ol { margin: 8px 0 0 1.2em; }
.sv-winner { font-size: 1.15em; font-weight: 600; }
.sv-compare .sv-text { max-height: 22em; }
.sv-load-title { font-size: 0.9em; opacity: 0.8; margin-bottom: 4px; }
.sv-load-rows { display: flex; flex-wrap: wrap; gap: 8px; }
.sv-load-rows .sv-panel { flex: 1 1 220px; min-width: 0; font-size: 0.85em; }
.sv-load-rows .sv-text { max-height: 12em; overflow-y: auto; }
.sv-load-config pre { white-space: pre-wrap; overflow-wrap: anywhere; }
.sv-engines { overflow-x: auto; }
.sv-engines-table { font-size: 0.9em; border-collapse: collapse; }
.sv-engines-table th, .sv-engines-table td { padding: 2px 8px; text-align: right; white-space: nowrap; }
.sv-engines-table th { white-space: normal; vertical-align: bottom; }   /* headings wrap: the table fits a laptop */
.sv-engines-table th:first-child, .sv-engines-table td:first-child { text-align: left; }
.sv-engines-notes { font-size: 0.85em; opacity: 0.85; margin-top: 4px; }
.sv-engines-step { font-weight: 600; margin-bottom: 2px; }
"""

KEYS_NOTE = ("Keys: **space** runs or stops (Run, Teach, Replay) \u00b7 **\u2190 \u2192** step cycles (Teach, and "
             "Replay cycle by cycle) \u00b7 **Esc** closes a token's details. Not while typing in a box.")

# Plotly sizes its charts on window resize events: send one after the zoom changes.
LARGE_TEXT_JS = ("(on) => { document.body.classList.toggle('sv-large', on); "
                 "setTimeout(() => window.dispatchEvent(new Event('resize')), 50); return on; }")
DARK_JS = "() => { document.body.classList.toggle('dark'); }"
PRESENTER_JS = LARGE_TEXT_JS.replace("sv-large", "sv-presenter")


# Gradio 6 runs no script inside gr.HTML: this one is in the page's <head> (`launch_options`). One
# listener for the whole page, so it serves tokens re-rendered after it ran, in every tab. A token's
# details are its `title` (what a hover shows), pinned in a panel that stays until Escape, the
# panel's close button, or a click elsewhere.
HEAD = """<style>
/* Outside Gradio's container, so it cannot go in CSS (whose rules in an @media block Gradio scopes to it). */
@media (max-width: 700px) {
  .gradio-container .main.app { padding-left: 8px !important; padding-right: 8px !important; }
}
</style>
<script>
(() => {
  let pinned = null;
  const panel = () => {
    let box = document.getElementById('sv-pin');
    if (!box) {
      box = document.createElement('div');
      box.id = 'sv-pin'; box.setAttribute('role', 'dialog'); box.setAttribute('aria-label', 'token details');
      box.innerHTML = '<button type="button" aria-label="close">\u00d7</button><div class="sv-pin-text"></div>';
      box.querySelector('button').addEventListener('click', unpin);
      document.body.appendChild(box);
    }
    return box;
  };
  function unpin() {
    const box = document.getElementById('sv-pin');
    if (box) box.hidden = true;
    if (pinned) pinned.classList.remove('sv-pinned');
    pinned = null;
  }
  function pin(token) {
    const details = token.getAttribute('title') || token.dataset.details || '';
    if (!details) return;
    unpin();
    const box = panel();
    box.querySelector('.sv-pin-text').textContent = details;
    box.hidden = false;
    const r = token.getBoundingClientRect();
    const left = Math.max(8, Math.min(r.left + scrollX, scrollX + innerWidth - box.offsetWidth - 8));
    box.style.left = left + 'px';
    box.style.top = (r.bottom + scrollY + 6) + 'px';
    token.classList.add('sv-pinned');
    pinned = token;
  }
  // A token view of fixed height shows its end: each update replaces the HTML (a fresh box, scrolled
  // to the top), so every box is scrolled to its newest line once, when it appears.
  const follow = () => document.querySelectorAll('.sv-race .sv-text:not([data-followed])').forEach((box) => {
    box.dataset.followed = '1';
    box.scrollTop = box.scrollHeight;
  });
  new MutationObserver(follow).observe(document.documentElement, {childList: true, subtree: true});
  const TOKEN = '.sv-tok[data-verdict], .sv-branches';
  document.addEventListener('click', (event) => {
    const token = event.target.closest && event.target.closest(TOKEN);
    if (token) pin(token);
    else if (!(event.target.closest && event.target.closest('#sv-pin'))) unpin();
  });
  document.addEventListener('keydown', (event) => {
    if (event.key === 'Escape') { unpin(); return; }
    const token = event.target.closest && event.target.closest(TOKEN);
    if (token && (event.key === 'Enter' || event.key === ' ')) { event.preventDefault(); pin(token); }
  });
  // Keys (the page's "Keys" note): space runs or stops the tab's run, the arrows step cycles in Teach and
  // in Replay's cycle-by-cycle mode. Never while typing, nor on a control whose own keys they are.
  const shown = (selector) => {
    const el = document.querySelector(selector);
    return el && el.offsetParent !== null ? el : null;
  };
  const busy = (selector) => [...document.querySelectorAll(selector)].some(
    (el) => el.offsetParent !== null && /^\\s*(Running|Replaying|Loading|Decoding)/.test(el.textContent));
  const TABS = [
    {run: '#run', stop: '#stop', status: '#stats .sv-state, #stats .sv-loading'},
    {run: '#replay-play', stop: '#replay-stop', status: '#replay-stats .sv-state',
     next: '#replay-next', previous: '#replay-previous',
     stepping: () => /Cycle by cycle/.test((document.querySelector('#replay-speed input:checked') || {}).value || '')},
    {run: '#teach-run', stop: '#teach-stop', status: '#teach-position', next: '#teach-next',
     previous: '#teach-previous', stepping: () => true},
  ];
  const OWN_KEYS = 'input, textarea, select, button, summary, a[href], [contenteditable], [role=slider], ' +
                   '[role=tab], [role=option], [role=listbox], ' + TOKEN;
  let pressed = 0;     // a run started by a key counts as running until its first update (a second or two)
  document.addEventListener('keydown', (event) => {
    if (event.defaultPrevented || event.ctrlKey || event.metaKey || event.altKey) return;
    if (event.target.closest && event.target.closest(OWN_KEYS)) return;
    const tab = TABS.find((t) => shown(t.run));
    if (!tab) return;
    if (event.key === ' ') {
      event.preventDefault();
      if (busy(tab.status) || Date.now() - pressed < 1500) { shown(tab.stop) && shown(tab.stop).click(); pressed = 0; }
      else { shown(tab.run).click(); pressed = Date.now(); }
    } else if ((event.key === 'ArrowRight' || event.key === 'ArrowLeft') && tab.next && tab.stepping()) {
      const button = shown(event.key === 'ArrowRight' ? tab.next : tab.previous);
      if (button && !button.disabled) { event.preventDefault(); button.click(); }
    }
  });
})();
</script>"""


def theme() -> gr.themes.Base:
    """A plain theme with strong contrast that reads from the back of a room."""
    return gr.themes.Default(primary_hue="blue", neutral_hue="slate", text_size="lg", radius_size="sm")
