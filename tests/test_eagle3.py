"""EAGLE-3 heads (core.eagle3, models.heads): drafting from the target's fused low/middle/high hidden
states is lossless (greedy equals `generate` in fp32: chains, trees, a batch); every drafted token is
what the head computes from the whole sequence at once; the training-time test's unrolled steps are
exactly the drafting steps; a head written by hand in the speculators layout loads and drafts what its
weights say; a head for another target, an unknown variant and an unreachable hub id are refused."""

import json

import pytest
import torch
from conftest import make_llama
from safetensors.torch import save_file
from transformers import LlamaConfig

from specviz import speculative_decode
from specviz.core.decoding import batched_speculative_decode
from specviz.core.eagle3 import Eagle3Head, default_layer_ids
from specviz.core.events import row_outputs
from specviz.core.head import HeadDrafter, HeadTreeDrafter
from specviz.errors import SpecvizError
from specviz.models.heads import load_head, save_head
from specviz.models.pairs import make_drafter
from specviz.settings import parse_draft

V, HIDDEN, LAYERS = 50, 32, 6
PROMPTS = [[1, 2, 3, 4], [7], [5, 5, 5, 9, 1, 2]]


def layer_config(vocab=V, hidden=HIDDEN) -> LlamaConfig:
    return LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=48, num_hidden_layers=1,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)


def random_head(seed=1, draft_ids=None, norm_before_residual=False) -> Eagle3Head:
    """An untrained head (exactness holds for any draft distribution) with spread-out weights."""
    torch.manual_seed(seed)
    draft_ids = torch.arange(0, 40, 2) if draft_ids is None else draft_ids
    head = Eagle3Head(layer_config(), draft_vocab_size=draft_ids.numel(), target_hidden_size=HIDDEN,
                      layer_ids=default_layer_ids(LAYERS), norm_before_residual=norm_before_residual)
    for parameter in head.parameters():
        torch.nn.init.normal_(parameter, std=0.3)
    return head.set_vocab(draft_ids)


@pytest.fixture(scope="module")
def target():
    return make_llama(0, layers=LAYERS, vocab=V, hidden=HIDDEN)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("eagle3")
    save_head(random_head(), path, target_name="tiny-llama", trained={}, k=3)
    return path


def greedy(target, prompt, n):
    ids = torch.tensor([prompt])
    return target.generate(ids, max_new_tokens=n, do_sample=False)[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("k", [1, 3])
def test_greedy_with_an_eagle3_head_equals_generate(target, folder, k):
    drafter = make_drafter(parse_draft(f"head:{folder}"), target, target_name="tiny-llama")
    assert isinstance(drafter.head, Eagle3Head) and drafter.hidden_layers == (0, 3, 5)
    for prompt in PROMPTS:
        out = [t for c in speculative_decode(target, drafter, torch.tensor([prompt]), max_new_tokens=20, k=k)
               for t in c.emitted]
        assert out == greedy(target, prompt, 20)


def test_greedy_trees_and_batches_with_an_eagle3_head_equal_generate(target, folder):
    chain = load_head(folder, target)
    tree = HeadTreeDrafter(chain, 2, 8)
    for prompt in PROMPTS:
        cycles = list(speculative_decode(target, tree, torch.tensor([prompt]), max_new_tokens=20, k=3))
        assert all(c.parents is not None for c in cycles[1:] if c.drafted)
        assert [t for c in cycles for t in c.emitted] == greedy(target, prompt, 20)
    out = row_outputs(batched_speculative_decode(target, chain, PROMPTS, max_new_tokens=15, k=3))
    for row, prompt in enumerate(PROMPTS):
        assert out[row] == greedy(target, prompt, 15)


def aux_features(target, head, tokens):
    with torch.inference_mode():
        out = target(torch.tensor([tokens]), output_hidden_states=list(head.hidden_layers))
        return torch.cat([out.hidden_states[i] for i in head.hidden_layers], dim=-1)


def teacher_forced_draft(target, head, tokens, n):
    """The head's greedy draft of n tokens after `tokens` without any cache: the target's hidden states
    the head reads (fused) of the whole sequence, the head over every position at once; each further
    token appends the head's own output (what vLLM's proposer feeds back) and the drafted token. Any
    head: EAGLE-3 or the first specviz heads (which read the last hidden state as it is)."""
    with torch.inference_mode():
        features = head.fuse(aux_features(target, head, tokens))[:, :-1]       # h_i reads token i+1
        ids = torch.tensor([tokens[1:]])
        drafted = []
        for _ in range(n):
            out = head(features, ids)[0][:, -1:]
            token = head.vocab[head.logits(out[0, 0]).float().argmax()]
            drafted.append(int(token))
            features, ids = torch.cat([features, out], dim=1), torch.cat([ids, token.view(1, 1)], dim=1)
    return drafted


def assert_drafts_are_teacher_forced(target, head, prompts, per_row):
    """Every drafted chain of each row's cycles is the head's cache-free prediction (10 deep ones at least)."""
    checked = deep = 0
    for row, cycles in per_row.items():
        tokens = list(prompts[row])
        for cycle in cycles:
            if cycle.drafted:
                assert cycle.drafted == teacher_forced_draft(target, head, tokens, len(cycle.drafted))
                checked += 1
                deep += len(cycle.drafted) > 1
            tokens += cycle.emitted
    assert checked >= 10 and deep >= 10


def test_every_drafted_token_is_what_the_head_computes_from_the_whole_sequence(target):
    # A head whose drafts often pass (draft ids = every target id), so cycles accept, roll back and
    # draft deep: each drafted chain must still be the head's cache-free prediction.
    drafter = HeadDrafter(random_head(seed=3, draft_ids=torch.arange(V)).bind(target))
    per_row = {row: list(speculative_decode(target, drafter, torch.tensor([prompt]), max_new_tokens=24, k=3))
               for row, prompt in enumerate(PROMPTS)}
    assert_drafts_are_teacher_forced(target, drafter.head, PROMPTS, per_row)


@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_the_training_time_test_unrolls_exactly_the_drafting_steps(target, norm_before_residual):
    # Step s at position i of the unrolled training pass = the s-th drafting step of a draft started
    # at position i - s, fed the sequence's own tokens.
    head = random_head(seed=4, norm_before_residual=norm_before_residual).bind(target)
    tokens = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
    with torch.inference_mode():
        fused = head.fuse(aux_features(target, head, tokens))[:, :-1]
        ids = torch.tensor([tokens[1:]])
        unrolled = head.unrolled(fused, ids, steps=3)
        for start in range(ids.shape[1] - 2):
            features = fused[:, :start + 1]
            out, cache = head(features, ids[:, :start + 1])
            for step in range(3):
                position = start + step
                if position >= ids.shape[1]:
                    break
                assert torch.allclose(unrolled[step][0, position], out[0, -1], atol=1e-5), (start, step)
                if position + 1 < ids.shape[1]:
                    out, cache = head(out[:, -1:], ids[:, position + 1:position + 2], start=position + 1,
                                      cache=cache)


# ----------------------------------------------------------------------------- the speculators layout by hand

CONSTANT = 17


def constant_head_folder(path, constant=CONSTANT, *, vocab=V, hidden=HIDDEN, heads=4, kv_heads=2, layers=(1, 3, 4),
                         eps=1e-6, verifier="tiny-llama"):
    """A head written with safetensors and json only, in the speculators layout, whose every draft is
    `constant`: gate_proj = up_proj makes the MLP's silu(g) * g >= 0, down_proj puts it on coordinate 0
    alone, where the residual is zero (fc and o_proj rows 0 are zero); the final norm keeps only
    coordinate 0, so the normed output is a positive multiple of e_0 whatever the features, and
    lm_head's one non-zero row (the draft id d2t maps to `constant`) scores it; the rest score 0."""
    torch.manual_seed(0)
    h, inter, dim = hidden, 48, hidden // heads
    draft_ids = sorted({3, 11, 40, constant})
    draft, row = torch.tensor(draft_ids), draft_ids.index(constant)
    gate = torch.randn(inter, h) / h ** 0.5
    down = torch.zeros(h, inter)
    down[0] = 1.0
    fc, o_proj = torch.randn(h, 3 * h) / h ** 0.5, torch.randn(h, heads * dim) / h ** 0.5
    fc[0] = 0.0
    o_proj[0] = 0.0
    norm = torch.zeros(h)
    norm[0] = 1.0
    lm_head = torch.zeros(len(draft_ids), h)
    lm_head[row, 0] = 100.0
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[draft] = True
    weights = {"fc.weight": fc, "layers.0.input_layernorm.weight": torch.ones(h),
               "layers.0.hidden_norm.weight": torch.ones(h),
               "layers.0.self_attn.q_proj.weight": torch.randn(heads * dim, 2 * h) / h ** 0.5,
               "layers.0.self_attn.k_proj.weight": torch.randn(kv_heads * dim, 2 * h) / h ** 0.5,
               "layers.0.self_attn.v_proj.weight": torch.randn(kv_heads * dim, 2 * h) / h ** 0.5,
               "layers.0.self_attn.o_proj.weight": o_proj,
               "layers.0.post_attention_layernorm.weight": torch.ones(h),
               "layers.0.mlp.gate_proj.weight": gate, "layers.0.mlp.up_proj.weight": gate.clone(),
               "layers.0.mlp.down_proj.weight": down, "norm.weight": norm, "lm_head.weight": lm_head,
               "d2t": draft - torch.arange(len(draft_ids)), "t2d": t2d}
    path.mkdir(exist_ok=True)
    save_file(weights, str(path / "model.safetensors"))
    config = {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
              "transformer_layer_config": {"model_type": "llama", "vocab_size": vocab, "hidden_size": h,
                                           "intermediate_size": inter, "num_hidden_layers": 1,
                                           "hidden_act": "silu", "head_dim": dim, "tie_word_embeddings": False,
                                           "num_attention_heads": heads, "num_key_value_heads": kv_heads,
                                           "rms_norm_eps": eps, "max_position_embeddings": 2048,
                                           "rope_theta": 10000.0},
              "draft_vocab_size": len(draft_ids), "target_hidden_size": h, "norm_before_residual": False,
              "eagle_aux_hidden_state_layer_ids": list(layers),
              "speculators_config": {"proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 4}],
                                     "verifier": {"name_or_path": verifier}}}
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_a_head_written_by_hand_in_the_speculators_layout_drafts_what_its_weights_say(target, tmp_path):
    folder = constant_head_folder(tmp_path / "constant", eps=target.config.rms_norm_eps)
    drafter = load_head(folder, target)
    assert drafter.default_k == 4 and drafter.hidden_layers == (1, 3, 4)
    cycles = list(speculative_decode(target, drafter, torch.tensor([PROMPTS[0]]), max_new_tokens=20, k=4))
    drafted = [t for c in cycles for t in c.drafted]
    assert len(drafted) >= 12 and set(drafted) == {CONSTANT}
    assert [t for c in cycles for t in c.emitted] == greedy(target, PROMPTS[0], 20)
    tree = list(speculative_decode(target, HeadTreeDrafter(drafter, 2, 6), torch.tensor([PROMPTS[0]]),
                                   max_new_tokens=10, k=3))
    assert CONSTANT in [t for c in tree for t in c.drafted]


def test_a_saved_head_reloads_with_its_weights_and_config(target, folder):
    config = json.loads((folder / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["norm_before_residual"] is False
    assert config["eagle_aux_hidden_state_layer_ids"] == [0, 3, 5] and config["draft_vocab_size"] == 20
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    assert config["transformer_layer_config"]["num_hidden_layers"] == 1
    head = load_head(folder, target, int8=False).head     # the weights as saved (not a drafting copy)
    assert torch.equal(head.vocab, torch.arange(0, 40, 2))
    assert torch.equal(head.state_dict()["fc.weight"], random_head().state_dict()["fc.weight"])


def test_heads_for_another_target_or_variant_and_unreachable_hub_ids_are_refused(target, folder, tmp_path,
                                                                                monkeypatch):
    wider = make_llama(0, layers=LAYERS, vocab=V, hidden=64)
    with pytest.raises(SpecvizError, match=r"trained for tiny-llama.*hidden size 32 \(the target's: 64\)"):
        load_head(folder, wider, target_name="wider")
    shallow = make_llama(0, layers=2, vocab=V, hidden=HIDDEN)
    with pytest.raises(SpecvizError, match=r"layer ids \[0, 3, 5\] include \[3, 5\], outside 0\.\.1"):
        load_head(folder, shallow)
    variant = tmp_path / "variant"
    variant.mkdir()
    config = json.loads((folder / "config.json").read_text())
    (variant / "config.json").write_text(json.dumps({**config, "norm_before_fc": True}))
    with pytest.raises(SpecvizError, match="norm_before_fc"):
        load_head(variant, target)
    (variant / "config.json").write_text(json.dumps({**config, "speculators_model_type": "mlp_speculator"}))
    with pytest.raises(SpecvizError, match="not an EAGLE-3 head"):
        load_head(variant, target)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SpecvizError, match="HF_HUB_OFFLINE is set"):
        load_head("nobody-here/no-such-eagle3-head", target)


# ----------------------------------------------------------------------------- layer ids and the verifier

def test_default_layer_ids_are_three_distinct_states_below_the_last_layers_output():
    # vLLM's default (2, L // 2, L - 3) wherever it is three distinct ids; below 7 layers it repeats one,
    # and (0, L // 2, L - 1) is used. Fewer than 3 layers: no three distinct states, refused.
    assert default_layer_ids(30) == (2, 15, 27) and default_layer_ids(7) == (2, 3, 4)
    assert default_layer_ids(6) == (0, 3, 5) and default_layer_ids(3) == (0, 1, 2)
    for layers in range(3, 100):
        ids = default_layer_ids(layers)
        assert len(set(ids)) == 3 and all(0 <= i < layers for i in ids) and list(ids) == sorted(ids), layers
    for layers in (0, 1, 2):
        with pytest.raises(ValueError, match=f"a target of {layers} layer"):
            default_layer_ids(layers)


@pytest.mark.parametrize("layers, why", [((1, 3, LAYERS), rf"include \[{LAYERS}\], outside 0\.\.{LAYERS - 1}"),
                                         ((1, 3, 3), "repeat a layer"), ((-1, 3, 4), r"include \[-1\]")],
                         ids=["the last layer's output", "a layer twice", "below 0"])
def test_a_head_reading_the_last_layers_output_or_a_layer_twice_is_refused(target, tmp_path, layers, why):
    # State L is the last layer's output: normed in transformers' output_hidden_states, not in what vLLM
    # collects, so the two engines would fuse different features; vLLM collects a repeated id once.
    folder = constant_head_folder(tmp_path / "head", layers=layers, eps=target.config.rms_norm_eps)
    with pytest.raises(SpecvizError, match=f"cannot read the target's hidden states: its layer ids .*{why}"):
        load_head(folder, target)


def test_the_verifier_is_where_the_target_loads_from_and_old_display_names_still_match(target, tmp_path):
    from types import SimpleNamespace

    from specviz.models.head_files import SHIPPED_HEADS, is_made_for, made_for, read_config, shipped_head_for
    from specviz.models.heads import verifier_location
    from specviz.models.sources import cache_folder

    hub_id = "HuggingFaceTB/SmolLM2-135M-Instruct"
    copy = str(cache_folder() / "models" / "SmolLM2-135M-Instruct")
    model = lambda name_or_path: SimpleNamespace(config=SimpleNamespace(name_or_path=name_or_path))  # noqa: E731
    # The built-in (its converted copy here, or the hub) is written as its hub id; any other target as the
    # hub id or folder it was loaded from; a target that says neither, by its name.
    assert verifier_location(model(copy), "SmolLM2-135M-Instruct") == hub_id
    assert verifier_location(model(hub_id), "SmolLM2-135M-Instruct") == hub_id
    assert verifier_location(model(str(tmp_path)), tmp_path.name) == str(tmp_path)
    assert verifier_location(model("org/other"), "other") == "org/other"
    assert verifier_location(target, "tiny-llama") == "tiny-llama"
    shipped = read_config(SHIPPED_HEADS / "SmolLM2-135M-Instruct")
    assert made_for(shipped) == hub_id
    old = {"speculators_config": {"verifier": {"name_or_path": "SmolLM2-135M-Instruct"}}}
    for data in (shipped, old):
        for named in ("SmolLM2-135M-Instruct", "smollm2-135m-instruct", hub_id, copy):
            assert is_made_for(data, named), (made_for(data), named)
        assert not is_made_for(data, "org/other") and not is_made_for(data, str(tmp_path))
    assert is_made_for({"speculators_config": {"verifier": {"name_or_path": str(tmp_path)}}}, f"{tmp_path}/")
    assert shipped_head_for(hub_id) == shipped_head_for(copy) == SHIPPED_HEADS / "SmolLM2-135M-Instruct"
    with pytest.raises(SpecvizError, match=r"shipped for the built-in SmolLM2-135M-Instruct, and the target is "
                                           r"org/other.*train-draft --target org/other"):
        shipped_head_for("org/other")


@pytest.mark.parametrize("draft_ids", [None, torch.arange(V)])
def test_sampled_head_drafts_write_plain_sampling_text(target, draft_ids):
    """Drafter-invariant sampling: a head (its own vocabulary a part of the target's, or all of it),
    drafting chains and trees, writes exactly the text plain sampling writes with the seed."""
    from specviz.core.plain import autoregressive_decode

    prompt = torch.tensor([PROMPTS[2]])
    chain = HeadDrafter(random_head(seed=3, draft_ids=draft_ids).bind(target))
    accepted = 0
    for seed in (0, 1):
        plain = [s.token for s in autoregressive_decode(target, prompt, 20, temperature=0.9, seed=seed)]
        for drafter in (chain, HeadTreeDrafter(chain, 2, 6)):
            cycles = list(speculative_decode(target, drafter, prompt, max_new_tokens=20, k=3, temperature=0.9,
                                             seed=seed))
            assert [t for c in cycles for t in c.emitted] == plain
            accepted += sum(c.num_accepted for c in cycles)
    assert accepted > 0
