"""An RNN over a padded batch packed by its lengths (pack_padded_sequence -> LSTM/GRU/RNN ->
pad_packed_sequence): packing, the packed recurrence and unpacking read the lengths' values on
the CPU, so each is one graph break at the user's call, run natively (torch.compile skips the two
functions and does not trace RNN modules), never several breaks inside torch's code with small
graphs between them. Values and gradients stay eager's; an RNN over a plain tensor stays in the
graph."""
from __future__ import annotations

import torch
import torch.nn as nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import kiln
from kiln.backends import CountingBackend


class Encoder(nn.Module):
    def __init__(self, cell: str = "lstm", sort: bool = False, bidirectional: bool = True) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 8, padding_idx=0)
        rnn = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN}[cell]
        self.rnn = rnn(8, 6, batch_first=True, bidirectional=bidirectional)
        self.out = nn.Linear(12 if bidirectional else 6, 3)
        self.sort = sort

    def forward(self, ids: torch.Tensor, lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.emb(ids) * 2
        packed = pack_padded_sequence(x, lens.cpu(), batch_first=True, enforce_sorted=self.sort)
        out, state = self.rnn(packed)
        h = state[0] if isinstance(state, tuple) else state
        padded, _ = pad_packed_sequence(out, batch_first=True, total_length=ids.size(1))
        mask = torch.arange(ids.size(1))[None, :] < lens[:, None]
        pooled = (padded * mask[..., None]).sum(1) / lens[:, None]
        return self.out(pooled).tanh(), h.sum(0)


def _inputs(sort: bool) -> tuple[torch.Tensor, torch.Tensor]:
    lens = torch.tensor([7, 5, 3, 2]) if sort else torch.tensor([3, 7, 2, 5])
    ids = torch.randint(1, 20, (4, 7), generator=torch.Generator().manual_seed(0))
    ids[torch.arange(7)[None] >= lens[:, None]] = 0
    return ids, lens


def _compiled(model: nn.Module, *args: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], CountingBackend]:
    kiln.reset()
    backend = CountingBackend()
    return kiln.compile(model, backend=backend)(*args), backend


def test_packed_lstm_breaks_once_per_call_and_matches_eager() -> None:
    torch.manual_seed(0)
    model = Encoder("lstm")
    ids, lens = _inputs(False)
    with torch.no_grad():
        want = model(ids, lens)
        got, backend = _compiled(model, ids, lens)
    torch.testing.assert_close(got, want)
    # the graph before packing and the one after unpacking; none inside torch's rnn.py
    assert backend.frame_count == 2, backend.frame_count
    reasons = [str(r) for r in kiln.explain(model)(ids, lens).break_reasons]
    assert not any("rnn.py" in r for r in reasons), reasons


def test_packed_gru_and_rnn_sorted_one_direction_and_a_plain_gru_in_the_graph() -> None:
    for cell in ("gru", "rnn"):
        torch.manual_seed(1)
        model = Encoder(cell, sort=True, bidirectional=False)
        ids, lens = _inputs(True)
        with torch.no_grad():
            want = model(ids, lens)
            got, backend = _compiled(model, ids, lens)
        torch.testing.assert_close(got, want)
        assert backend.frame_count == 2, (cell, backend.frame_count)
    _plain_rnn_stays_in_one_graph()


def test_packed_lstm_training_gradients_match_eager() -> None:
    torch.manual_seed(2)
    model = Encoder("lstm")
    twin = Encoder("lstm")
    twin.load_state_dict(model.state_dict())
    ids, lens = _inputs(False)
    sum(o.square().sum() for o in model(ids, lens)).backward()
    got, backend = _compiled(twin, ids, lens)
    sum(o.square().sum() for o in got).backward()
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=name)
    assert backend.frame_count == 2, backend.frame_count


def _plain_rnn_stays_in_one_graph() -> None:
    """Only a packed sequence runs the RNN natively: over a tensor it is traced into the graph."""
    class Plain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = nn.GRU(8, 6, batch_first=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.rnn(x * 2)[0].relu()

    torch.manual_seed(3)
    model, x = Plain(), torch.randn(2, 5, 8)
    with torch.no_grad():
        got, backend = _compiled(model, x)
        torch.testing.assert_close(got, model(x))
    assert backend.frame_count == 1 and kiln.stats()["graph_breaks"] == 0, kiln.stats()
