"""Token trees: the attention mask and positions of a tree pass, the cache keeping exactly the accepted
path, greedy output equal to `target.generate` for tree drafters, and the n-gram tree drafter."""

import random

import pytest
import torch

from conftest import make_gpt2, make_llama, make_qwen2, reference
from specviz import speculative_decode
from specviz.core import tree_shape, trees
from specviz.core.drafters import Draft, Drafter
from specviz.core.lookup_trees import NgramTreeDrafter

N = 40
PROMPT = torch.tensor([[5, 9, 13, 22, 5, 9, 13, 40, 41, 5, 9, 13, 22, 5, 9, 30, 5, 9]])


class OracleTree(Drafter):
    """A test drafter that knows the target's greedy continuation: a chain of it, with a wrong
    sibling beside every node (and a wrong grandchild under each sibling), so every pass accepts
    deep into the tree while rejected branches sit between the accepted nodes in the cache."""

    name = "oracle-tree"

    def __init__(self, target, vocab: int, depth_cut: int | None = None):
        self.target, self.vocab, self.depth_cut = target, vocab, depth_cut

    def propose(self, sequence, k, sampler):
        with torch.inference_mode():
            ids, greedy = sequence, []
            for _ in range(min(k, self.depth_cut or k)):
                token = int(self.target(ids).logits[0, -1].argmax())
                greedy.append(token)
                ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
        tokens, parents, last = [], [], -1
        for token in greedy:
            wrong = (token + 1) % self.vocab
            tokens += [wrong, token, (wrong + 3) % self.vocab]   # sibling first: it is tried and rejected
            parents += [last, last, len(tokens) - 3]
            last = len(tokens) - 2
        return Draft(torch.tensor(tokens, dtype=torch.long), None, parents)


def test_tree_mask_and_positions():
    # prefix: 2 new tokens after 3 cached; nodes: 0 and 1 under the root, 2 under 0.
    mask, positions = trees.tree_inputs([-1, -1, 0], cached=3, prefix=2, dtype=torch.float32, device="cpu")
    seen = (mask[0, 0] == 0).int().tolist()
    assert seen == [[1, 1, 1, 1, 0, 0, 0, 0],
                    [1, 1, 1, 1, 1, 0, 0, 0],
                    [1, 1, 1, 1, 1, 1, 0, 0],
                    [1, 1, 1, 1, 1, 0, 1, 0],
                    [1, 1, 1, 1, 1, 1, 0, 1]]
    assert positions.tolist() == [[3, 4, 5, 5, 6]]
    assert tree_shape.children([-1, -1, 0]) == [[0, 1], [2], [], []]
    assert tree_shape.subtree_without([-1, 0, 1, -1], {1}) == [0, 3]
    with pytest.raises(ValueError):
        tree_shape.check_tree([0])


@pytest.mark.parametrize("make", [make_llama, make_gpt2, make_qwen2])
@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_ngram_tree_greedy_equals_generate(make, k):
    target = make(0)
    cycles = list(speculative_decode(target, NgramTreeDrafter(), PROMPT, N, k=k))
    assert [t for c in cycles for t in c.emitted] == reference(target, PROMPT)
    for c in cycles:
        if not c.is_tree:                         # the last token needs no draft at all
            assert c.drafted == [] and c is cycles[-1]
            continue
        assert c.emitted[: c.num_accepted] == [c.drafted[i] for i in c.path]
        assert [c.parents[i] for i in c.path] == ([-1] + c.path[:-1] if c.path else [])   # a path from the root
        assert c.verdicts.count("accepted") == len(c.path)


@pytest.mark.parametrize("make", [make_llama, make_gpt2])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_deep_accepted_paths_keep_exactly_their_cache_entries(make, k):
    # Rejected siblings sit between the accepted nodes in the pass; if the cache kept any of them,
    # or lost an accepted one, the next passes would attend to the wrong tokens and the output
    # would leave the greedy one.
    target, oracle = make(0), make(0)          # the same weights; the oracle's calls are not counted
    fed = []
    handle = target.register_forward_pre_hook(
        lambda module, args, kwargs: fed.append((args[0] if args else kwargs["input_ids"]).shape[1]), with_kwargs=True)
    try:
        cycles = list(speculative_decode(target, OracleTree(oracle, target.config.vocab_size), PROMPT, N, k=k))
    finally:
        handle.remove()
    assert [t for c in cycles for t in c.emitted] == reference(target, PROMPT)
    generated = 0
    for c in cycles:                            # the whole greedy chain is accepted every time
        assert c.num_accepted == min(k, N - 1 - generated)
        generated += len(c.emitted)
    assert len(cycles) == -(-N // (k + 1))
    # Each pass feeds what the cache lacks and nothing more: [last token] + the tree (the prompt first).
    assert fed == [PROMPT.shape[1] + len(cycles[0].drafted)] + [1 + len(c.drafted) for c in cycles[1:]]


def test_trees_stop_at_eos():
    target = make_llama(0)
    plain = reference(target, PROMPT)
    eos = plain[12]
    cycles = list(speculative_decode(target, OracleTree(target, target.config.vocab_size), PROMPT, N, k=4,
                                     eos_token_id=eos))
    out = [t for c in cycles for t in c.emitted]
    assert out == reference(target, PROMPT, eos=eos) and out[-1] == eos
    cycles = list(speculative_decode(target, NgramTreeDrafter(), PROMPT, N, k=4, eos_token_id=eos))
    assert [t for c in cycles for t in c.emitted] == out


def test_ngram_tree_merges_every_earlier_match_into_a_trie():
    # "5 9" occurs three times before the end: followed by 13 22, 13 40 and 30 5.
    ids = torch.tensor([[5, 9, 13, 22, 7, 5, 9, 13, 40, 7, 5, 9, 30, 5, 5, 9]])
    draft = NgramTreeDrafter(max_ngram=2, budget=5).propose(ids, 2, None)
    nodes = list(zip(draft.tokens.tolist(), draft.parents))
    # 13 is shared by two continuations (count 2), so it comes first; the budget keeps five nodes.
    assert nodes[0] == (13, -1) and (30, -1) in nodes and draft.probs is None
    assert len(nodes) == 5 and all(p < i for i, (_, p) in enumerate(nodes))
    children_of_13 = [t for t, p in nodes if p == 0]
    assert sorted(children_of_13) == [22, 40]
    assert NgramTreeDrafter().propose(torch.tensor([[1, 2, 3]]), 4, None).tokens.numel() == 0


# ----------------------------------------------------------------------------- suffix decoding

def test_suffix_greedy_equals_generate_and_a_repeated_request_drafts_the_earlier_answer():
    from specviz.core.lookup_trees import SuffixDrafter

    target = make_llama(0)
    drafter = SuffixDrafter()
    first = list(speculative_decode(target, drafter, PROMPT, N, k=8))
    again = list(speculative_decode(target, drafter, PROMPT, N, k=8))       # the same request again
    expected = reference(target, PROMPT)
    assert [t for c in first for t in c.emitted] == expected == [t for c in again for t in c.emitted]
    # The second time the drafter has the first answer: nearly every pass accepts a full branch.
    assert len(again) <= len(first) // 2 and sum(c.num_accepted for c in again) >= N - len(again) - 2
    drafter.forget()
    fresh = list(speculative_decode(target, drafter, PROMPT, N, k=8))
    assert len(fresh) == len(first)                                          # nothing remembered
    # Each cycle says which nodes only the earlier request proposed: none the first time, and the
    # second time most of what was accepted.
    assert all(not any(c.from_earlier or []) for c in first)     # (None: nothing was drafted)
    from specviz.metrics import summarize
    stats = summarize(again)
    assert stats.accepted_from_earlier >= stats.accepted // 2 > 0
    assert summarize(first).drafted_from_earlier == 0
    assert drafter.without_memory().requests == 0 and drafter.without_memory() is not drafter


def test_trie_draft_marks_nodes_only_earlier_requests_proposed():
    from specviz.core.lookup_trees import trie_draft

    draft = trie_draft([[1, 2, 3], [1, 2, 4], [5]], 8, 1, "cpu", earlier=[False, True, True])
    by_token = dict(zip(draft.tokens.tolist(), draft.from_earlier))
    assert by_token == {1: False, 2: False, 3: False, 4: True, 5: True}


@pytest.mark.parametrize("make", [make_llama, make_gpt2, make_qwen2])
def test_suffix_on_repetitive_text_equals_generate(make):
    from specviz.core.lookup_trees import SuffixDrafter

    target = make(1)
    for k in (2, 5):
        cycles = list(speculative_decode(target, SuffixDrafter(), PROMPT, N, k=k))
        assert [t for c in cycles for t in c.emitted] == reference(target, PROMPT)


def test_suffix_tree_size_follows_the_match_length():
    from specviz.core.lookup_trees import SuffixDrafter

    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 9, 9, 7, 8]])
    long_match = SuffixDrafter(spec_factor=1.0).propose(ids, 8, None)        # "7 8" matched: 2 nodes at most
    assert len(long_match.parents) <= 2 and long_match.tokens.tolist()[0] in (9, 1)
    assert SuffixDrafter().propose(torch.tensor([[5, 6, 7]]), 4, None).tokens.numel() == 0


# ----------------------------------------------------------------------------- draft-model trees (EAGLE-2)

def draft_tree(draft, branch, budget):
    from specviz.core.draft_trees import DraftTreeDrafter
    from specviz.core.drafters import DraftModelDrafter

    return DraftTreeDrafter(DraftModelDrafter(draft), branch, budget)


@pytest.mark.parametrize("make", [make_llama, make_gpt2, make_qwen2])
@pytest.mark.parametrize("k, branch, budget", [(1, 2, 4), (3, 2, 8), (4, 3, 16), (6, 4, 32)])
def test_draft_model_trees_equal_generate(make, k, branch, budget):
    from conftest import truncated_copy

    target = make(0)
    drafter = draft_tree(truncated_copy(target, 1), branch, budget)
    cycles = list(speculative_decode(target, drafter, PROMPT, N, k=k))
    assert [t for c in cycles for t in c.emitted] == reference(target, PROMPT)
    assert all(len(c.drafted) <= budget for c in cycles) and sum(c.is_tree for c in cycles) >= len(cycles) - 1
    assert max(len(c.drafted) for c in cycles) > k            # wider than a chain
    # The shown draft probabilities are the draft's own (not the 1.0 of a one-hot candidate).
    assert all(0.0 < p <= 1.0 for c in cycles for p in c.draft_probs) and any(p < 1.0 for c in cycles
                                                                           for p in c.draft_probs)


def test_draft_model_trees_stop_at_eos_and_early_exit_trees_work():
    from specviz.core.drafters import early_exit_model

    target = make_llama(0)
    plain = reference(target, PROMPT)
    eos = plain[12]
    drafter = draft_tree(early_exit_model(target, 2), 2, 8)
    cycles = list(speculative_decode(target, drafter, PROMPT, N, k=4, eos_token_id=eos))
    out = [t for c in cycles for t in c.emitted]
    assert out == reference(target, PROMPT, eos=eos) and out[-1] == eos


def test_the_draft_cache_keeps_exactly_the_accepted_path():
    # With the target as its own draft the tree holds good paths; after every cycle the draft's
    # cache must equal a fresh forward over the accepted sequence (no rejected node left in it).
    target = make_llama(0)
    drafter = draft_tree(target, 2, 12)
    sequence = PROMPT
    for cycle in speculative_decode(target, drafter, PROMPT, 24, k=4):
        sequence = torch.cat([sequence, torch.tensor([cycle.emitted])], dim=1)
        cache = drafter.base.cache.cache          # the plain cache under a batch of one
        kept = cache.get_seq_length()
        assert kept <= sequence.shape[1]
        with torch.inference_mode():
            fresh = target(sequence[:, :kept], use_cache=True).past_key_values
        assert torch.allclose(cache.layers[0].keys, fresh.layers[0].keys, atol=1e-4)
        assert torch.allclose(cache.layers[-1].values, fresh.layers[-1].values, atol=1e-4)


def test_a_tree_branch_is_a_setting_of_draft_models_only(tiny):
    from specviz.errors import SpecvizError
    from specviz.runs import execute
    from specviz.settings import RunSettings, validate

    settings = validate(RunSettings(target="tiny", draft="small", k=4, branch=2, tree_budget=8, max_new_tokens=24,
                                    chat=False, fixed_k=True))
    run = execute(settings, "the cat sat on the mat and the dog", tiny.loader(settings), baseline=True)
    assert run.identical and sum(c.is_tree for c in run.cycles) >= len(run.cycles) - 1
    assert "tree (top-2, 8 nodes)" in run.draft_name
    with pytest.raises(SpecvizError, match="draft model, early exit or a draft head"):
        validate(RunSettings(fixed_k=True, draft="ngram", branch=2))
    with pytest.raises(SpecvizError, match="tree branch"):
        validate(RunSettings(fixed_k=True, draft="self:2", branch=99))


# ----------------------------------------------------------------------------- a chain is a degenerate tree

def chain_as_tree(n):
    return list(range(-1, n - 1))               # every node's parent is the node before it


def random_case(case):
    """Target logits, drafted tokens and (half the time) the draft distributions they came from."""
    from specviz.core.sampling import sample_from

    rng = random.Random(case)
    n, vocab = rng.randint(0, 6), rng.choice([3, 11, 97])
    g = torch.Generator().manual_seed(case)
    logits = torch.randn(n + 1, vocab, generator=g) * rng.choice([0.3, 2.0, 6.0])
    draft_probs = None
    if rng.random() < 0.5:
        draft_probs = torch.softmax(torch.randn(n, vocab, generator=g) * rng.choice([0.3, 2.0, 6.0]), dim=-1)
        tokens = sample_from(draft_probs, g) if n else torch.zeros(0, dtype=torch.long)
    else:                                       # one-hot: often the target's argmax, so some are accepted
        tops = logits.argmax(dim=-1)
        tokens = torch.tensor([int(tops[i]) if rng.random() < 0.7 else rng.randrange(vocab) for i in range(n)],
                              dtype=torch.long)
    return logits, tokens, draft_probs, rng.choice([0.5, 1.0, 1.7])


def test_a_chain_given_as_a_tree_verifies_exactly_as_the_chain():
    from specviz.core.sampling import verify_greedy, verify_sampled

    outcomes = set()
    for case in range(400):
        logits, tokens, draft_probs, temperature = random_case(case)
        n = tokens.shape[0]
        chain = verify_greedy(logits, tokens, draft_probs)
        tree = trees.verify_tree_greedy(logits, tokens, chain_as_tree(n), draft_probs)
        assert tree.path == list(range(chain.num_accepted)), case
        assert (tree.correction, tree.correction_prob, tree.target_top) == (
            chain.correction, chain.correction_prob, chain.target_top)
        assert (tree.target_probs, tree.draft_probs) == (chain.target_probs, chain.draft_probs)

        # Seeded sampling: the same draws from the same generator, and nothing else drawn.
        probs = torch.softmax(logits / temperature, dim=-1)
        chain_generator, tree_generator = torch.Generator().manual_seed(case), torch.Generator().manual_seed(case)
        chain = verify_sampled(probs, draft_probs, tokens, torch.rand(n, generator=chain_generator), chain_generator)
        tree = trees.verify_tree_sampled(probs, draft_probs, tokens, chain_as_tree(n),
                                         torch.rand(n, generator=tree_generator), tree_generator)
        assert tree.path == list(range(chain.num_accepted)), case
        assert (tree.correction, tree.correction_prob, tree.uniforms) == (
            chain.correction, chain.correction_prob, chain.uniforms)
        assert (tree.target_probs, tree.draft_probs) == (chain.target_probs, chain.draft_probs)
        assert (tree.residual is None) == (chain.residual is None)
        assert tree.residual is None or torch.equal(tree.residual, chain.residual)
        assert torch.equal(tree_generator.get_state(), chain_generator.get_state())
        outcomes.add((draft_probs is None, "none" if not chain.num_accepted else "all" if chain.num_accepted == n
                      else "some"))
    # The cases cover every outcome (nothing accepted, some, everything), with and without draft distributions.
    assert len(outcomes) == 6


class AsTree(Drafter):
    """Another drafter's chains, handed over as trees whose nodes each have one child."""

    def __init__(self, drafter):
        self.drafter = drafter

    def begin(self, prompt_ids):
        self.drafter.begin(prompt_ids)

    def propose(self, sequence, k, sampler):
        draft = self.drafter.propose(sequence, k, sampler)
        return Draft(draft.tokens, draft.probs, chain_as_tree(draft.tokens.shape[0]))

    def rollback(self, valid_length):
        self.drafter.rollback(valid_length)


@pytest.mark.parametrize("draft_kind", ["model", "ngram"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_run_drafting_chains_as_trees_is_the_chain_run(draft_kind, temperature):
    from conftest import truncated_copy
    from specviz.core.drafters import DraftModelDrafter, PromptLookupDrafter

    target = make_llama(0)

    def drafter():
        return DraftModelDrafter(truncated_copy(target, 1)) if draft_kind == "model" else PromptLookupDrafter()

    for seed in range(3):
        chain = list(speculative_decode(target, drafter(), PROMPT, N, k=4, temperature=temperature, seed=seed))
        tree = list(speculative_decode(target, AsTree(drafter()), PROMPT, N, k=4, temperature=temperature,
                                       seed=seed))
        assert len(tree) == len(chain) and any(c.is_tree for c in tree)
        for c, t in zip(chain, tree):
            assert (t.emitted, t.num_accepted, t.correction, t.correction_kind, t.uniforms) == (
                c.emitted, c.num_accepted, c.correction, c.correction_kind, c.uniforms)
            # A tree pass runs attention with an explicit mask, a chain pass the causal one: the same
            # numbers up to float round-off.
            assert t.target_probs == pytest.approx(c.target_probs, rel=1e-4)
            assert t.correction_prob == pytest.approx(c.correction_prob, rel=1e-4)
            assert t.draft_probs == c.draft_probs and [i for i, _ in t.residual_top] == [i for i, _ in c.residual_top]


def test_greedy_tree_probabilities_are_the_softmax_at_each_parent():
    rng = random.Random(1)
    for case in range(50):
        parents = [-1] + [rng.randrange(-1, i) for i in range(1, rng.randint(1, 8))]
        logits = torch.randn(len(parents) + 1, 11, generator=torch.Generator().manual_seed(case)) * 3
        tokens = torch.tensor([int(logits[p + 1].argmax()) if rng.random() < 0.6 else rng.randrange(11)
                               for p in parents])
        v = trees.verify_tree_greedy(logits, tokens, parents)
        probs = torch.softmax(logits, dim=-1)
        assert v.target_probs == pytest.approx([float(probs[p + 1, t]) for p, t in zip(parents, tokens.tolist())])
        row = v.path[-1] + 1 if v.path else 0
        assert v.correction == int(logits[row].argmax())
        assert v.correction_prob == pytest.approx(float(probs[row].max()))
        assert [int(tokens[i]) for i in v.path] == v.target_top[:len(v.path)]


@pytest.mark.parametrize("path", [[0, 1, 2, 3], [1, 4, 6], []], ids=["chain-shaped", "branching", "empty"])
def test_keeping_the_accepted_path_moves_only_the_path(path):
    # After a tree pass the cache keeps the prefix and the accepted nodes, in order. The prefix never
    # moves (copying a long cache every pass cost up to 15 ms here, a third of a step); a path already
    # just after the prefix (a chain-shaped tree, as suffix decoding drafts on repeated text) moves nothing.
    from transformers import DynamicCache

    prefix, nodes = 40, 8
    cache = DynamicCache()
    for layer in range(3):
        cache.update(torch.randn(1, 2, prefix + nodes, 4), torch.randn(1, 2, prefix + nodes, 4), layer)
    expected = [(layer.keys[..., list(range(prefix)) + [prefix + i for i in path], :].clone(),
                 layer.values[..., list(range(prefix)) + [prefix + i for i in path], :].clone())
                for layer in cache.layers]
    storage = [layer.keys.data_ptr() for layer in cache.layers]
    trees.keep_path(cache, prefix, [prefix + i for i in path])
    assert cache.get_seq_length() == prefix + len(path)
    for layer, (keys, values), pointer in zip(cache.layers, expected, storage):
        assert torch.equal(layer.keys, keys) and torch.equal(layer.values, values)
        assert layer.keys.data_ptr() == pointer          # the same storage: the prefix was not copied
