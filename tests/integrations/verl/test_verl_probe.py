"""The bypass-mode mismatch probe (tokengrad.integrations.verl.probe) against a brute-force computation.

verl's real TrainingWorker needs an FSDP/Megatron engine (and its rollout server's imports), so a stand-in
worker plays its part with the same two entry points and verl's own pieces: `train_mini_batch` splits the
rollout batch with verl's `tensordict_utils.make_iterator`, runs a bigram model's forward with grad and
verl's real loss entry `ppo_loss` (loss mode `tokengrad`) per mini-batch, then an optimizer update;
`infer_batch` is the no-grad forward, returning the engine's no-padding layout. The probe wraps the
stand-in's `train_mini_batch` exactly as it wraps verl's. Reference: log pi_old per response token by
explicit loops over the model's weights before each probed batch's first update."""

from __future__ import annotations

import functools

import pytest

verl = pytest.importorskip("verl")
torch = pytest.importorskip("torch")

from tensordict import TensorDict  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.workers.config import ActorConfig  # noqa: E402
from verl.workers.utils import losses  # noqa: E402

from tokengrad import load_run  # noqa: E402
from tokengrad.integrations import verl as tg_verl  # noqa: E402
from tokengrad.integrations.verl import probe  # noqa: E402

pytestmark = pytest.mark.verl
B, P, R, V = 4, 2, 5, 11  # sequences, prompt length, response length, vocabulary
LENS = torch.tensor([5, 3, 4, 2])


class Worker:
    """Stand-in for verl's TrainingWorker: a bigram LM (logits of the next token = a row of `table`)."""

    def __init__(self, loss_mode="tokengrad", mini_batch=2):
        torch.manual_seed(0)
        self.table = torch.nn.Parameter(torch.randn(V, V))
        self.opt = torch.optim.SGD([self.table], lr=2.0)
        config = ActorConfig(
            strategy="fsdp",
            rollout_n=2,
            loss_agg_mode="token-mean",
            policy_loss={"loss_mode": loss_mode},
            use_torch_compile=False,
            ppo_micro_batch_size_per_gpu=mini_batch,
        )
        self.loss_fn = functools.partial(losses.ppo_loss, config=config)
        self.mini_batch = mini_batch
        self.infer_calls = 0

    def _flat_log_probs(self, data):
        """The engine's no-padding output: at a sequence's position i, log p(token i+1 | token i)."""
        ids, att = data["input_ids"], data["attention_mask"].bool()  # [b, P + R]
        lp = torch.log_softmax(self.table[ids[:, :-1]], -1).gather(-1, ids[:, 1:, None])[..., 0]
        lp = torch.nn.functional.pad(lp, (0, 1))  # [b, P + R]; the last position scores nothing
        return lp[att]  # [nnz]

    def infer_batch(self, data):
        self.infer_calls += 1
        assert tu.get(data, "compute_loss") is False
        with torch.no_grad():
            flat = self._flat_log_probs(data)
        return tu.get_tensordict(tensor_dict={"log_probs": flat}, non_tensor_dict={"metrics": {}})

    def train_mini_batch(self, data):
        for mb in tu.make_iterator(data, mini_batch_size=self.mini_batch, epochs=1, dataloader_kwargs={}):
            for key, value in (("dp_size", 1), ("batch_num_tokens", int(mb["response_mask"].sum()))):
                tu.assign_non_tensor_data(mb, key, value)
            tu.assign_non_tensor_data(mb, "global_batch_size", self.mini_batch)
            self.opt.zero_grad()
            loss, _ = self.loss_fn(model_output={"log_probs": self._flat_log_probs(mb)}, data=mb)
            loss.backward()
            self.opt.step()


def _rollout_batch(seed, bypass=True):
    """A rollout batch; the engine's log mu is the model's log pi plus noise (a bf16-like gap)."""
    g = torch.Generator().manual_seed(seed)
    response_mask = (torch.arange(R)[None] < LENS[:, None]).float()  # [B, R]
    attention_mask = torch.cat([torch.ones(B, P), response_mask], 1).long()  # [B, P + R]
    input_ids = torch.randint(0, V, (B, P + R), generator=g) * attention_mask
    mu = -torch.rand(B, R, generator=g) * response_mask  # [B, R] (values unrelated to pi: a large gap)
    data = TensorDict(
        {
            "input_ids": input_ids,
            "prompts": input_ids[:, :P],
            "responses": input_ids[:, P:],
            "attention_mask": attention_mask,
            "response_mask": response_mask,
            "rollout_log_probs": mu,
            "old_log_probs": mu.clone() if bypass else mu - 0.05,
            "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None].expand(B, R).contiguous(),
        },
        batch_size=[B],
    )
    return data


def _brute_force_log_pi(table, data):
    """[B, R] log pi(response token j) from the weights, one token at a time."""
    out = torch.zeros(B, R)
    ids = data["input_ids"]
    for b in range(B):
        for j in range(int(LENS[b])):
            prev, tok = ids[b, P + j - 1], ids[b, P + j]
            row = table[prev].detach().double()
            out[b, j] = float(row[tok] - torch.logsumexp(row, 0))
    return out


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(tg_verl.RUN_DIR_ENV, str(tmp_path / "run"))
    monkeypatch.setattr(Worker, "train_mini_batch", Worker.train_mini_batch)  # undone after the test
    probe.wrap_train_mini_batch(Worker)
    probe._UPDATES.clear()
    yield tmp_path / "run"
    tg_verl.close_recording()


def test_probe_restores_the_gap_every_n_rollout_batches(run_dir, monkeypatch):
    monkeypatch.setenv(tg_verl.PROBE_ENV, "2")
    worker = Worker()
    want = {}  # rollout batch -> brute-force log pi_old [B, R] before its first update
    for batch_idx in range(3):
        data = _rollout_batch(seed=batch_idx)
        want[batch_idx] = (_brute_force_log_pi(worker.table, data), data)
        worker.train_mini_batch(data)
    assert worker.infer_calls == 2  # batches 0 and 2 were probed; one forward each
    tg_verl.close_recording()
    run = load_run(run_dir)
    tok = run.tokens().sort_values(["step", "sample_id", "position"])
    steps = run.steps.set_index("step")
    assert sorted(tok["step"].unique()) == [0, 1, 2, 3, 4, 5]  # 3 rollout batches x 2 mini-batches
    for batch_idx, probed in ((0, True), (1, False), (2, True)):
        log_pi, data = want[batch_idx]
        rows = tok[tok["step"].isin([2 * batch_idx, 2 * batch_idx + 1])]
        mask = data["response_mask"].bool()
        old = torch.tensor(rows["old_logprob"].to_numpy())
        if not probed:  # bypass without the probe: verl's old (= mu), no gap recorded
            assert rows["rollout_logprob"].isna().all()
            assert torch.allclose(old, data["rollout_log_probs"][mask])
            continue
        # both mini-batches carry pi_old from before the batch's first update, although the second
        # mini-batch's loss ran after one update (its logprob differs from pi_old)
        assert torch.allclose(old, log_pi[mask], atol=1e-5)
        second = rows[rows["step"] == 2 * batch_idx + 1]
        assert not torch.allclose(
            torch.tensor(second["logprob"].to_numpy()),
            torch.tensor(second["old_logprob"].to_numpy()),
            atol=1e-3,
        )
        assert torch.allclose(
            torch.tensor(rows["rollout_logprob"].to_numpy()), data["rollout_log_probs"][mask]
        )
        for step, sl in ((2 * batch_idx, slice(0, 2)), (2 * batch_idx + 1, slice(2, 4))):
            d = (log_pi[sl] - data["rollout_log_probs"][sl])[mask[sl]].double()
            assert steps.loc[step, "rollout_mismatch"] == pytest.approx(float(d.abs().mean()), rel=1e-5)
            assert steps.loc[step, "rollout_mismatch_max"] == pytest.approx(float(d.abs().max()), rel=1e-5)
            assert steps.loc[step, "rollout_kl_k1"] == pytest.approx(float((-d).mean()), rel=1e-5)
            assert steps.loc[step, "rollout_kl_k3"] == pytest.approx(
                float((d.exp() - d - 1).mean()), rel=1e-5
            )


def test_probe_stays_off_where_verl_has_pi_old(run_dir, monkeypatch):
    """Decoupled mode (old_log_probs is the trainer's), another loss mode, or no option: no forward."""
    monkeypatch.setenv(tg_verl.PROBE_ENV, "1")
    worker = Worker()
    worker.train_mini_batch(_rollout_batch(seed=5, bypass=False))
    assert worker.infer_calls == 0
    vanilla = Worker(loss_mode="vanilla")
    vanilla.train_mini_batch(_rollout_batch(seed=6))
    assert vanilla.infer_calls == 0
    monkeypatch.delenv(tg_verl.PROBE_ENV)
    worker.train_mini_batch(_rollout_batch(seed=7))
    assert worker.infer_calls == 0
    tg_verl.close_recording()
    tok = load_run(run_dir).tokens()
    assert tok["rollout_logprob"].notna().any()  # the decoupled batch's gap is verl's own


@pytest.mark.parametrize("bad", ["0", "-3", "every"])
def test_a_bad_probe_interval_is_refused_by_name(monkeypatch, bad):
    monkeypatch.setenv(tg_verl.PROBE_ENV, bad)
    with pytest.raises(ValueError, match="TOKENGRAD_MISMATCH_PROBE_EVERY must be a positive whole number"):
        tg_verl.VerlOptions.from_env()
