"""Long prompts of one's own, for what changes after a long context (`python scripts/long_prompts.py FILE`):
the bundled benchmark set's summarisation and rewrite passages joined into one document (~780 tokens for
the built-in model) under four requests (a question, a summary of each, a search, a rewrite), written as
a prompt set in the bundled set's format (category `long`), for `scripts/decision_quality.py --prompts
FILE` or `specviz bench --prompts FILE`. Spec-Bench's summarization and RAG prompts are as long; these are
not taken from them, so that nothing is chosen on what docs/benchmarks.md reports."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specviz.catalog import BENCH_PROMPTS_FILE  # noqa: E402 - after the sys.path insert


def long_prompts(bundled: Path = BENCH_PROMPTS_FILE) -> dict:
    """The prompt set: four requests over the bundled passages joined."""
    data = json.loads(Path(bundled).read_text())
    passages = [p["prompt"].split("\n\n", 1)[1] for p in data["prompts"]
                if p["category"] in ("summarisation", "rewrite") and "\n\n" in p["prompt"]]
    document = "\n\n".join(passages)
    requests = [f"Read these notes and answer the question.\n\n{document}\n\nQuestion: what will happen to the city "
                "library, and when?",
                f"Summarise each of these texts in one sentence:\n\n{document}",
                f"Here are some texts.\n\n{document}\n\nWhich of these texts mention money, and what do they say "
                "about it?",
                f"{document}\n\nRewrite the second text above in the past tense."]
    return {"categories": ["long"],
            "prompts": [{"id": f"long-{i}", "category": "long", "prompt": text} for i, text in enumerate(requests)]}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__.split("\n\n")[0], file=sys.stderr)
        return 2
    Path(argv[0]).write_text(json.dumps(long_prompts(), indent=1) + "\n")
    print(f"wrote {argv[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
