"""Comparing what ``lightning_gae.explain`` returns with the dense float64 oracle."""

from __future__ import annotations

import torch

import lightning_gae as lg
from tests.helpers.oracle import reference_row, relative_error

TOL = 1e-4
METHODS = lg.METHODS


def assert_matches_reference(exp, refs, method, lengths=None):
    """Each sample's row equals the oracle's on its real tokens and is 0 on padding."""
    largest = 0.0
    for b, (attns, grads) in enumerate(refs):
        expected = reference_row(method, attns, grads, int(exp.query[b]))
        n = expected.shape[0] if lengths is None else lengths[b]
        assert expected.shape[0] == n
        largest = max(largest, expected.abs().max().item())
        err = relative_error(exp.tokens[b, :n], expected) if expected.abs().max() > 0 else exp.tokens[b].abs().max().item()
        assert err < TOL, f"sample {b}: relative error {err:.2e}"
        assert torch.all(exp.tokens[b, n:] == 0)
    assert largest > 0, "references of all zeros would prove nothing"
    assert exp.tokens.dtype == torch.float32


def logit_score(exp):
    return lambda logits, b: logits[0, int(exp.target[b])]


def padded_ids(lengths, vocab=60, seed=0):
    """Random token ids ``[B, max(lengths)]`` zeroed after each length, and their attention mask."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (len(lengths), max(lengths)), generator=g)
    mask = (torch.arange(max(lengths))[None] < torch.tensor(lengths)[:, None]).long()
    return ids * mask, mask


def recorded_rows(method, layers, grads, query, keep):
    """``method``'s row from attention records and their gradients made by hand (no forward), one token set: what the
    method's rule reads from a :class:`~lightning_gae.methods.RecordedForward`."""
    from lightning_gae.engine.token_sets import TokenSets
    from lightning_gae.methods import RecordedForward, get_method

    sets = TokenSets(records=list(layers), query_sets=["tokens"] * len(layers), key_sets=["tokens"] * len(layers),
                     sizes={"tokens": keep.shape[1]}, query_set="tokens")
    run = RecordedForward(sets=sets, keeps={"tokens": keep}, starts={"tokens": query}, score=torch.zeros(query.shape[0]),
                          target=None, logits=None, recorder=None, gradients=list(grads))
    with torch.no_grad():
        return get_method(method).rule(run)


def explain_gae(model, inputs, query, lean):
    """GAE on the memory-lean path (``lean``) or from the recorded probabilities, whichever explain() would pick."""
    from lightning_gae.engine.forward import recorded_forward
    from lightning_gae.methods import get_method

    with recorded_forward(model, inputs, None, query, None, None, lean=lean) as run:
        if lean:
            run.lean_backward()
        else:
            run.backward(every_call=True)
        return run.explanation("gae", get_method("gae").rule(run))
