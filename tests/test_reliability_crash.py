"""Crashes: the writer SIGKILLed at random points reruns to the same bytes and
leaves no process behind; a torchrun loader job SIGKILLed at a random step
resumes at another world size with the reference data (tools/reliability/crash.py)."""

from __future__ import annotations

import shutil

import pytest

from tools.reliability import crash


@pytest.mark.slow
def test_killed_writer_reruns_to_identical_bytes_and_leaves_no_worker_behind(small_dataset, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for path in small_dataset.sources[:30]:
        shutil.copy(path, corpus / path.name)
    result = crash.writer_kills(inputs=str(corpus / "*.py"), out_root=tmp_path / "out", runs=2, seed=7, workers=2)
    assert result["kills"] >= 2
    # A tokenizer process that outlives its killed parent would hold
    # memory and a core forever; the writer's workers must follow their parent.
    assert result["orphans"] == 0


@pytest.mark.slow
@pytest.mark.torchrun
def test_killed_loader_job_resumes_at_another_world_size_bit_identically(small_dataset, tmp_path):
    result = crash.loader_kill_resume(
        data=small_dataset.url, work=tmp_path, runs=2, seed=11, total_steps=16, resume_steps=4, worlds=(1, 2, 3)
    )
    assert len(result["resumed"]) == 2
    assert all(r["from_world"] != r["to_world"] for r in result["resumed"])
    assert result["steps_checked"] >= 2 * 4
