from tokenyard.core.types import ModelDeploymentSpec
from tokenyard.operator.revision import revision_hash

BASE = {
    "model": {"weights": {"uri": "hf://m", "digest": "sha256:" + "a" * 64}},
    "engine": {"image": "vllm:1"},
}


def spec(**overrides):
    data = {**BASE, **overrides}
    return ModelDeploymentSpec.parse(data)


def test_replicas_placement_routing_and_rollout_make_no_revision():
    base = revision_hash(spec())
    assert revision_hash(spec(replicas=7)) == base
    assert revision_hash(spec(placement={"required": "rack", "strategy": "Spread"})) == base
    assert revision_hash(spec(routing={"weights": {"prefixCache": 3}})) == base
    assert revision_hash(spec(rollout={"maxSurge": 3})) == base


def test_artifact_engine_and_parallelism_each_make_a_revision():
    base = revision_hash(spec())
    changed = [
        spec(model={"weights": {"uri": "hf://m", "digest": "sha256:" + "b" * 64}}),
        spec(
            model={
                "weights": {"uri": "hf://m", "digest": "sha256:" + "a" * 64},
                "tokenizer": {"uri": "hf://t"},
            }
        ),
        spec(engine={"image": "vllm:2"}),
        spec(engine={"image": "vllm:1", "args": ["--max-model-len=4096"]}),
        spec(engine={"image": "vllm:1", "env": [{"name": "A", "value": "1"}]}),
        spec(engine={"image": "vllm:1", "podTemplate": {"spec": {"tolerations": [{"key": "gpu"}]}}}),
        spec(parallelism={"tensor": 2}),
    ]
    hashes = [revision_hash(s) for s in changed]
    assert base not in hashes and len(set(hashes)) == len(hashes)


def test_defaults_written_explicitly_do_not_change_the_revision():
    # The API server fills in defaults; an object read back must hash like the one applied.
    assert revision_hash(spec()) == revision_hash(
        spec(engine={"image": "vllm:1", "port": 8000}, parallelism={"tensor": 1})
    )
