"""A small class at once (issue 52): eight API clients press Run within a moment on a hosted server
(tiny models, a target slow enough that a race lasts seconds): nobody is refused, everyone gets a
verdict, the six who asked for the same race share one measurement that says how many it was shown
to, and every client's first view comes before its race's first event (its place in line, or the
race so far). `scripts/class_at_once.py` repeats the full class (30) on the built-in model, timed."""

import threading

import pytest
from conftest import running_app

pytestmark = pytest.mark.slow       # an app server in a subprocess, eight clients

SAME = "the cat sat on the mat and the cat sat on the"
OWN = ["the dog sat on the", "a cat and a dog"]


def submit(url: str, prompt: str, bell: threading.Barrier, seen: dict) -> None:
    from gradio_client import Client

    client = Client(url, verbose=False)
    try:
        bell.wait()
        job = client.submit(prompt=prompt, max_new_tokens=64, api_name="/run")
        views = [view for view in job]
        seen[threading.get_ident()] = (prompt, views, job.outputs()[-1])
    finally:
        client.close()


def test_a_class_at_once_is_served_and_shares_its_race():
    with running_app("slow", tiny=True) as app:
        from gradio_client import Client

        Client(app.url, verbose=False).predict(prompt="warm up", max_new_tokens=8, api_name="/run")
        prompts = [SAME] * 6 + OWN
        bell, seen = threading.Barrier(len(prompts)), {}
        threads = [threading.Thread(target=submit, args=(app.url, p, bell, seen)) for p in prompts]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
    assert len(seen) == len(prompts)                          # nobody refused, nobody failed
    measurements = [final[-1]["measurement"] for _, _, final in seen.values()]
    assert all(m is not None for m in measurements)
    same = [m for (prompt, _, _), m in zip(seen.values(), measurements) if prompt == SAME]
    assert len({m["measured_at"] for m in same}) == 1         # one measurement for the six
    assert max(m["shown_to"] for m in same) == 6
    assert any("shown to 6 people" in m["label"] for m in same)
    own = [m for (prompt, _, _), m in zip(seen.values(), measurements) if prompt != SAME]
    assert all(m["shown_to"] == 1 for m in own)
