"""Pool-policy validators (CONTRACT section 6): every rule, accepted and refused."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pytest

from app.capacity.policy import (
    PolicyContext,
    PolicyRegistry,
    has_join_set,
    mig_instances_per_gpu,
    prewarm_images,
    readable_policy,
    registry,
    replicas,
    single_tenant,
    validate_policy,
)
from app.errors import InvalidInput

CUSTOM = PolicyContext(pool_class="metal-host", sharing="exclusive", site_kind="custom")
PLATFORM = PolicyContext(pool_class="metal-host", sharing="exclusive", site_kind="platform")
MIG = PolicyContext(pool_class="metal-dedicated", sharing="mig", site_kind="custom")
TIMESLICE = PolicyContext(pool_class="vps-host", sharing="timeslice", site_kind="custom")
MPS = PolicyContext(pool_class="provider", sharing="mps", site_kind="custom")

HASH = "sha256:" + "0123456789abcdef" * 4
JOIN = {"apiServer": "https://k8s.example.com:6443", "token": "abcdef.0123456789abcdef"}
JOIN_SET: dict[str, Any] = {**JOIN, "caCertHash": HASH}


def refused(policy: object, ctx: PolicyContext = CUSTOM) -> InvalidInput:
    with pytest.raises(InvalidInput) as info:
        validate_policy(policy, ctx)
    assert info.value.code == "INVALID_INPUT"
    assert info.value.message  # every refusal says why
    return info.value


def assert_field(policy: object, field: str, ctx: PolicyContext = CUSTOM) -> InvalidInput:
    error = refused(policy, ctx)
    assert error.field == field, error.message
    assert error.details["field"] == field
    return error


# --- the policy object ----------------------------------------------------------


def test_empty_policy_is_valid() -> None:
    assert validate_policy({}, CUSTOM) == {}


@pytest.mark.parametrize("policy", [None, [], "x", 1, True, [("a", 1)]])
def test_policy_must_be_an_object(policy: object) -> None:
    assert_field(policy, "policy")


def test_policy_keys_must_be_strings() -> None:
    assert_field({1: True}, "policy")


def test_unknown_key_names_the_key() -> None:
    error = assert_field({"singleTenant": True, "hugePages": {}}, "policy.hugePages")
    assert "hugePages" in error.message
    assert "hugepages" in error.message  # lists the known keys as a hint


def test_unknown_odd_key_is_bracketed() -> None:
    assert_field({"a.b": 1}, 'policy["a.b"]')


def test_unknown_key_reported_before_other_errors() -> None:
    assert_field({"hugepages": "bad", "nope": 1}, "policy.nope")


def test_full_policy_round_trips() -> None:
    policy: dict[str, Any] = {
        "hugepages": {"2Mi": 1024, "1Gi": 4},
        "kernelModules": ["nvidia", "nvidia_uvm", "vfio-pci"],
        "kubernetes": {**JOIN_SET, "labels": {"team": "ml", "example.com/tier": "gold"}},
        "platformOperated": True,
        "singleTenant": False,
        "prewarmImages": ["nvcr.io/nvidia/pytorch:24.05-py3"],
    }
    assert validate_policy(policy, PLATFORM) == policy


def test_input_is_never_mutated_nor_aliased() -> None:
    policy: dict[str, Any] = {
        "hugepages": {"2Mi": 8},
        "kernelModules": ["nvidia"],
        "kubernetes": {**JOIN_SET, "labels": {"a": "b"}},
        "sharing": {"replicas": 4},
        "prewarmImages": ["ghcr.io/org/app:1"],
    }
    before = copy.deepcopy(policy)
    result = validate_policy(policy, TIMESLICE)
    assert policy == before
    assert result == before
    # Changing the result must not reach back into the caller's data.
    assert result is not policy
    for key in ("hugepages", "kernelModules", "kubernetes", "sharing", "prewarmImages"):
        assert result[key] is not policy[key]
    assert result["kubernetes"]["labels"] is not policy["kubernetes"]["labels"]


def test_input_not_mutated_on_refusal() -> None:
    policy: dict[str, Any] = {"kubernetes": {"apiServer": "https://x.example"}, "singleTenant": 1}
    before = copy.deepcopy(policy)
    refused(policy)
    assert policy == before


# --- hugepages ------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [{"2Mi": 0}, {"1Gi": 1_048_576}, {"2Mi": 512, "1Gi": 2}, {}],
)
def test_hugepages_accepted(value: dict[str, int]) -> None:
    assert validate_policy({"hugepages": value}, CUSTOM) == {"hugepages": value}


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ([1], "policy.hugepages"),
        (None, "policy.hugepages"),
        ({"4Mi": 1}, "policy.hugepages.4Mi"),
        ({"2mi": 1}, "policy.hugepages.2mi"),
        ({"2Mi": -1}, "policy.hugepages.2Mi"),
        ({"2Mi": 1_048_577}, "policy.hugepages.2Mi"),
        ({"1Gi": True}, "policy.hugepages.1Gi"),
        ({"1Gi": 2.0}, "policy.hugepages.1Gi"),
        ({"1Gi": "2"}, "policy.hugepages.1Gi"),
        ({"2Mi": 1, "1Gi": None}, "policy.hugepages.1Gi"),
    ],
)
def test_hugepages_refused(value: object, field: str) -> None:
    assert_field({"hugepages": value}, field)


# --- kernelModules ---------------------------------------------------------------


def test_kernel_modules_accepted() -> None:
    modules = ["nvidia", "nvidia-uvm", "vfio_pci", "a" * 64, *[f"m{i}" for i in range(60)]]
    assert len(modules) == 64
    assert validate_policy({"kernelModules": modules}, CUSTOM) == {"kernelModules": modules}
    assert validate_policy({"kernelModules": []}, CUSTOM) == {"kernelModules": []}


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ("nvidia", "policy.kernelModules"),
        ({"nvidia": True}, "policy.kernelModules"),
        ([f"m{i}" for i in range(65)], "policy.kernelModules"),
        (["ok", "Nvidia"], "policy.kernelModules[1]"),
        (["ok", "ok2", ""], "policy.kernelModules[2]"),
        (["a" * 65], "policy.kernelModules[0]"),
        (["nvidia\n"], "policy.kernelModules[0]"),
        (["nv.idia"], "policy.kernelModules[0]"),
        (["ok", 3], "policy.kernelModules[1]"),
        (["a", "b", "c", "a"], "policy.kernelModules[3]"),
    ],
)
def test_kernel_modules_refused(value: object, field: str) -> None:
    assert_field({"kernelModules": value}, field)


# --- kubernetes -------------------------------------------------------------------


def test_kubernetes_join_set_accepted_on_custom_site() -> None:
    assert validate_policy({"kubernetes": JOIN_SET}, CUSTOM) == {"kubernetes": JOIN_SET}


@pytest.mark.parametrize(
    "value",
    [
        {},
        {"labels": {"team": "ml"}},
        {**JOIN_SET, "labels": {}},
        {**JOIN_SET, "apiServer": "https://10.0.0.1:6443"},
        {**JOIN_SET, "apiServer": "https://[fd00::1]:6443"},
        {**JOIN_SET, "apiServer": "https://k8s.example.com"},
        {**JOIN_SET, "apiServer": "https://rancher.example.com/k8s/clusters/c-1"},
        {**JOIN_SET, "token": "x" * 4096},
    ],
)
def test_kubernetes_accepted(value: dict[str, Any]) -> None:
    assert validate_policy({"kubernetes": value}, CUSTOM) == {"kubernetes": value}


@pytest.mark.parametrize(
    ("value", "field", "missing"),
    [
        ({"apiServer": JOIN["apiServer"]}, "policy.kubernetes.token", ["token", "caCertHash"]),
        ({"token": JOIN["token"]}, "policy.kubernetes.apiServer", ["apiServer", "caCertHash"]),
        ({"caCertHash": HASH, **JOIN}, None, []),
        ({**JOIN}, "policy.kubernetes.caCertHash", ["caCertHash"]),
        ({"caCertHash": HASH, "labels": {}}, "policy.kubernetes.apiServer", ["apiServer"]),
    ],
)
def test_kubernetes_join_set_all_or_nothing(
    value: dict[str, Any], field: str | None, missing: list[str]
) -> None:
    if field is None:
        validate_policy({"kubernetes": value}, CUSTOM)
        return
    error = assert_field({"kubernetes": value}, field)
    for name in missing:
        assert name in error.message


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ("https://k8s.example.com", "policy.kubernetes"),
        ({**JOIN_SET, "kubeconfig": "x"}, "policy.kubernetes.kubeconfig"),
        # apiServer
        ({**JOIN_SET, "apiServer": "http://k8s.example.com"}, "policy.kubernetes.apiServer"),
        ({**JOIN_SET, "apiServer": "https://"}, "policy.kubernetes.apiServer"),
        ({**JOIN_SET, "apiServer": "https://:6443"}, "policy.kubernetes.apiServer"),
        ({**JOIN_SET, "apiServer": "k8s.example.com:6443"}, "policy.kubernetes.apiServer"),
        ({**JOIN_SET, "apiServer": "https://u:p@k8s.example.com"}, "policy.kubernetes.apiServer"),
        ({**JOIN_SET, "apiServer": "https://k8s.example.com:99999"}, "policy.kubernetes.apiServer"),
        ({**JOIN_SET, "apiServer": "https://k8s.example.com/?a=1"}, "policy.kubernetes.apiServer"),
        ({**JOIN_SET, "apiServer": "https://k8s example.com"}, "policy.kubernetes.apiServer"),
        ({**JOIN_SET, "apiServer": "https://k8s_1.example.com"}, "policy.kubernetes.apiServer"),
        ({**JOIN_SET, "apiServer": "https://[fd00::1"}, "policy.kubernetes.apiServer"),
        ({**JOIN_SET, "apiServer": 443}, "policy.kubernetes.apiServer"),
        ({**JOIN_SET, "apiServer": None}, "policy.kubernetes.apiServer"),
        # token
        ({**JOIN_SET, "token": ""}, "policy.kubernetes.token"),
        ({**JOIN_SET, "token": "x" * 4097}, "policy.kubernetes.token"),
        ({**JOIN_SET, "token": "abc\r\nX-Evil: 1"}, "policy.kubernetes.token"),
        ({**JOIN_SET, "token": 12345}, "policy.kubernetes.token"),
        # caCertHash
        ({**JOIN_SET, "caCertHash": HASH.upper()}, "policy.kubernetes.caCertHash"),
        ({**JOIN_SET, "caCertHash": HASH[len("sha256:") :]}, "policy.kubernetes.caCertHash"),
        ({**JOIN_SET, "caCertHash": HASH + "0"}, "policy.kubernetes.caCertHash"),
        ({**JOIN_SET, "caCertHash": HASH[:-1]}, "policy.kubernetes.caCertHash"),
        ({**JOIN_SET, "caCertHash": "sha1:" + "0" * 40}, "policy.kubernetes.caCertHash"),
        ({**JOIN_SET, "caCertHash": HASH + "\n"}, "policy.kubernetes.caCertHash"),
    ],
)
def test_kubernetes_refused(value: object, field: str) -> None:
    assert_field({"kubernetes": value}, field)


def test_kubernetes_token_never_echoed() -> None:
    secret = "s3cr3t-" + "x" * 4096
    error = refused({"kubernetes": {**JOIN_SET, "token": secret}})
    assert "s3cr3t" not in error.message


@pytest.mark.parametrize(
    "labels",
    [
        {"team": "ml"},
        {"example.com/tier": "gold", "a.b-c.io/x_y.z": ""},
        {"n" * 63: "v" * 63},
        {"node.kubernetes.io/exclude-from-external-load-balancers": "true"},
        {"kubelet.kubernetes.io/foo": "bar", "topology.kubernetes.io/zone": "z1"},
        {"x.node.kubernetes.io/pool": "a"},
    ],
)
def test_kubernetes_labels_accepted(labels: dict[str, str]) -> None:
    value = {**JOIN_SET, "labels": labels}
    assert validate_policy({"kubernetes": value}, CUSTOM) == {"kubernetes": value}


@pytest.mark.parametrize(
    ("labels", "field"),
    [
        (["team=ml"], "policy.kubernetes.labels"),
        ({"team": 1}, "policy.kubernetes.labels.team"),
        ({"team": None}, "policy.kubernetes.labels.team"),
        ({"team": "v" * 64}, "policy.kubernetes.labels.team"),
        ({"team": "-ml"}, "policy.kubernetes.labels.team"),
        ({"team": "m l"}, "policy.kubernetes.labels.team"),
        ({"n" * 64: "v"}, "policy.kubernetes.labels." + "n" * 64),
        ({"": "v"}, 'policy.kubernetes.labels[""]'),
        ({"-team": "v"}, "policy.kubernetes.labels.-team"),
        ({"Example.com/x": "v"}, 'policy.kubernetes.labels["Example.com/x"]'),
        ({"/x": "v"}, 'policy.kubernetes.labels["/x"]'),
        ({"example.com/": "v"}, 'policy.kubernetes.labels["example.com/"]'),
        ({"a/b/c": "v"}, 'policy.kubernetes.labels["a/b/c"]'),
        ({("a" * 250) + ".com/x": "v"}, f'policy.kubernetes.labels["{"a" * 250}.com/x"]'),
        # kubelet refuses these in --node-labels
        ({"kubernetes.io/role": "gpu"}, 'policy.kubernetes.labels["kubernetes.io/role"]'),
        (
            {"node-role.kubernetes.io/worker": ""},
            'policy.kubernetes.labels["node-role.kubernetes.io/worker"]',
        ),
        ({"k8s.io/x": "y"}, 'policy.kubernetes.labels["k8s.io/x"]'),
        ({"foo.k8s.io/x": "y"}, 'policy.kubernetes.labels["foo.k8s.io/x"]'),
    ],
)
def test_kubernetes_labels_refused(labels: object, field: str) -> None:
    assert_field({"kubernetes": {**JOIN_SET, "labels": labels}}, field)


# --- platformOperated -------------------------------------------------------------


@pytest.mark.parametrize("value", [True, False])
def test_platform_operated_is_a_bool(value: bool) -> None:
    assert validate_policy({"platformOperated": value}, PLATFORM) == {"platformOperated": value}


@pytest.mark.parametrize("value", [1, 0, "true", None])
def test_platform_operated_refuses_non_bool(value: object) -> None:
    assert_field({"platformOperated": value}, "policy.platformOperated")


def test_platform_site_join_needs_platform_operated() -> None:
    error = assert_field({"kubernetes": JOIN_SET}, "policy.platformOperated", PLATFORM)
    assert "root" in error.message
    assert_field(
        {"kubernetes": JOIN_SET, "platformOperated": False}, "policy.platformOperated", PLATFORM
    )


def test_platform_site_join_with_platform_operated_true() -> None:
    policy = {"kubernetes": JOIN_SET, "platformOperated": True}
    assert validate_policy(policy, PLATFORM) == policy


def test_platform_operated_not_needed_without_join_set_or_on_custom_site() -> None:
    validate_policy({"kubernetes": {"labels": {"a": "b"}}}, PLATFORM)
    validate_policy({"kubernetes": {}}, PLATFORM)
    validate_policy({"kubernetes": JOIN_SET, "platformOperated": False}, CUSTOM)


def test_key_errors_come_before_rules() -> None:
    # A broken join set is reported as such, not as a missing platformOperated.
    assert_field(
        {"kubernetes": {**JOIN, "caCertHash": "x"}}, "policy.kubernetes.caCertHash", PLATFORM
    )


# --- sharing ---------------------------------------------------------------------


@pytest.mark.parametrize("ctx", [TIMESLICE, MPS])
@pytest.mark.parametrize("count", [1, 2, 48])
def test_sharing_replicas_accepted(ctx: PolicyContext, count: int) -> None:
    policy = {"sharing": {"replicas": count}}
    assert validate_policy(policy, ctx) == policy
    assert replicas(validate_policy(policy, ctx)) == count


@pytest.mark.parametrize("ctx", [CUSTOM, MIG])
def test_sharing_refused_outside_timeslice_and_mps(ctx: PolicyContext) -> None:
    assert_field({"sharing": {"replicas": 2}}, "policy.sharing", ctx)


@pytest.mark.parametrize(
    ("value", "field"),
    [
        (4, "policy.sharing"),
        ({}, "policy.sharing.replicas"),
        ({"replicas": 0}, "policy.sharing.replicas"),
        ({"replicas": 49}, "policy.sharing.replicas"),
        ({"replicas": True}, "policy.sharing.replicas"),
        ({"replicas": 2.0}, "policy.sharing.replicas"),
        ({"replicas": "2"}, "policy.sharing.replicas"),
        ({"replicas": 2, "mode": "x"}, "policy.sharing.mode"),
    ],
)
def test_sharing_refused(value: object, field: str) -> None:
    assert_field({"sharing": value}, field, TIMESLICE)


# --- migLayout -------------------------------------------------------------------


@pytest.mark.parametrize(
    "layout",
    [
        ["7g.80gb"],
        ["1g.10gb"] * 7,
        ["3g.40gb", "3g.40gb", "1g.10gb"],
        ["4g.40gb", "2g.20gb", "1g.10gb"],
        ["1g.5gb", "2g.10gb"],
    ],
)
def test_mig_layout_accepted(layout: list[str]) -> None:
    result = validate_policy({"migLayout": layout}, MIG)
    assert result == {"migLayout": layout}
    assert mig_instances_per_gpu(result) == len(layout)


@pytest.mark.parametrize("ctx", [CUSTOM, TIMESLICE, MPS])
def test_mig_layout_refused_outside_mig_pools(ctx: PolicyContext) -> None:
    assert_field({"migLayout": ["1g.10gb"]}, "policy.migLayout", ctx)


@pytest.mark.parametrize(
    ("layout", "field"),
    [
        ([], "policy.migLayout"),
        ("1g.10gb", "policy.migLayout"),
        (["1g.10gb"] * 8, "policy.migLayout"),
        (["4g.40gb", "4g.40gb"], "policy.migLayout"),
        (["7g.80gb", "1g.10gb"], "policy.migLayout"),
        (["1g.10gb", "8g.80gb"], "policy.migLayout[1]"),
        (["0g.10gb"], "policy.migLayout[0]"),
        (["1g.1000gb"], "policy.migLayout[0]"),
        (["1G.10GB"], "policy.migLayout[0]"),
        (["1g.10gb\n"], "policy.migLayout[0]"),
        (["1g.10gb", 1], "policy.migLayout[1]"),
    ],
)
def test_mig_layout_refused(layout: object, field: str) -> None:
    assert_field({"migLayout": layout}, field, MIG)


def test_mig_layout_message_explains_the_slice_sum() -> None:
    error = refused({"migLayout": ["4g.40gb", "4g.40gb"]}, MIG)
    assert "8" in error.message
    assert "7" in error.message


# --- singleTenant ----------------------------------------------------------------


@pytest.mark.parametrize("value", [True, False])
def test_single_tenant_accepted(value: bool) -> None:
    result = validate_policy({"singleTenant": value}, CUSTOM)
    assert result == {"singleTenant": value}
    assert single_tenant(result) is value


@pytest.mark.parametrize("value", [1, 0, "yes", None, []])
def test_single_tenant_refused(value: object) -> None:
    assert_field({"singleTenant": value}, "policy.singleTenant")


# --- prewarmImages ---------------------------------------------------------------


@pytest.mark.parametrize(
    "ref",
    [
        "docker.io/library/ubuntu",
        "docker.io/library/ubuntu:24.04",
        "nvcr.io/nvidia/pytorch:24.05-py3",
        "ghcr.io/org/team/app:v1.2.3_rc-1",
        "localhost/app",
        "localhost:5000/app:latest",
        "registry.example.com:8443/a/b/c",
        "10.0.0.5:5000/app",
        "[fd00::1]:5000/app",
        "quay.io/org/app@sha256:" + "a" * 64,
        "quay.io/org/app:1.0@sha256:" + "0" * 64,
        "quay.io/org/app@sha512:" + "b" * 128,
        "quay.io/my__org/my-app.v2/x--y:T",
        "quay.io/org/app:" + "t" * 128,
    ],
)
def test_prewarm_image_accepted(ref: str) -> None:
    assert validate_policy({"prewarmImages": [ref]}, CUSTOM) == {"prewarmImages": [ref]}


def test_prewarm_images_list_bounds() -> None:
    refs = [f"ghcr.io/org/app:{i}" for i in range(32)]
    assert validate_policy({"prewarmImages": refs}, CUSTOM) == {"prewarmImages": refs}
    assert validate_policy({"prewarmImages": []}, CUSTOM) == {"prewarmImages": []}
    too_many = [*refs, "ghcr.io/org/app:32"]
    assert_field({"prewarmImages": too_many}, "policy.prewarmImages")


@pytest.mark.parametrize(
    "ref",
    [
        "",
        "ubuntu",  # no registry host
        "library/ubuntu:24.04",  # first component is not a host
        "docker.io/Library/ubuntu",  # repository must be lowercase
        "docker.io/library/ubuntu:",
        "docker.io/library/ubuntu:-bad",
        "docker.io/library/ubuntu:" + "t" * 129,
        "docker.io/library/ubuntu@sha256:" + "a" * 63,
        "docker.io/library/ubuntu@sha256:" + "A" * 64,
        "docker.io/library/ubuntu@md5:" + "a" * 32,
        "docker.io/library/ubuntu@" + "a" * 64,
        "docker.io//ubuntu",
        "docker.io/library/ubuntu/",
        "docker.io/-ubuntu",
        "docker.io/ub..untu",
        "-docker.io/ubuntu",
        "https://docker.io/library/ubuntu",
        "docker.io/library/ubuntu latest",
        "docker.io/library/ubuntu\n",
        "docker.io/library/ubuntu:24.04:25",
        "reg.io/" + "/".join(["a" * 60] * 5),  # name over 255 characters
    ],
)
def test_prewarm_image_refused(ref: str) -> None:
    assert_field({"prewarmImages": ["ghcr.io/ok/app", ref]}, "policy.prewarmImages[1]")


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ("ghcr.io/org/app", "policy.prewarmImages"),
        ({"a": "ghcr.io/org/app"}, "policy.prewarmImages"),
        (["ghcr.io/org/app", None], "policy.prewarmImages[1]"),
        (["ghcr.io/a/b", "ghcr.io/c/d", "ghcr.io/a/b"], "policy.prewarmImages[2]"),
    ],
)
def test_prewarm_images_refused(value: object, field: str) -> None:
    assert_field({"prewarmImages": value}, field)


# --- helpers ---------------------------------------------------------------------


def test_helper_defaults() -> None:
    assert replicas({}) == 1
    assert replicas(None) == 1
    assert mig_instances_per_gpu({}) == 0
    assert mig_instances_per_gpu(None) == 0
    assert single_tenant({}) is False
    assert prewarm_images({}) == []
    assert prewarm_images({"prewarmImages": ["ghcr.io/a/b"]}) == ["ghcr.io/a/b"]
    assert has_join_set({"kubernetes": JOIN_SET})
    assert not has_join_set({"kubernetes": {"labels": {}}})
    assert not has_join_set({})


def test_replicas_refuses_corrupt_stored_policy() -> None:
    with pytest.raises(ValueError):
        replicas({"sharing": {"replicas": "2"}})
    with pytest.raises(ValueError):
        replicas({"sharing": {}})
    with pytest.raises(ValueError):
        mig_instances_per_gpu({"migLayout": "1g.10gb"})


# --- context and registry ----------------------------------------------------------


def test_context_is_frozen_and_checked() -> None:
    with pytest.raises(AttributeError):
        CUSTOM.sharing = "mig"  # type: ignore[misc]
    with pytest.raises(ValueError):
        PolicyContext(pool_class="metal", sharing="exclusive", site_kind="custom")
    with pytest.raises(ValueError):
        PolicyContext(pool_class="metal-host", sharing="shared", site_kind="custom")
    with pytest.raises(ValueError):
        PolicyContext(pool_class="metal-host", sharing="exclusive", site_kind="cloud")


def test_every_contract_key_is_registered_by_its_module() -> None:
    owners = {key: entry.module for key, entry in registry.keys().items()}
    assert owners == {
        "hugepages": "provision",
        "kernelModules": "provision",
        "kubernetes": "provision",
        "platformOperated": "provision",
        "sharing": "sharing",
        "migLayout": "sharing",
        "singleTenant": "tenancy",
        "prewarmImages": "images",
    }
    assert registry.owner("hugepages") == "provision"
    assert registry.owner("nope") is None
    assert [rule.name for rule in registry.rules()] == ["platform_join_needs_platform_operated"]


def test_registry_refuses_a_second_owner_for_a_key() -> None:
    local = PolicyRegistry()

    @local.key("x", module="a")
    def first(value: object, ctx: PolicyContext, field: str) -> object:
        return value

    with pytest.raises(ValueError, match="already registered by module 'a'"):

        @local.key("x", module="b")
        def second(value: object, ctx: PolicyContext, field: str) -> object:
            return value


def test_registry_runs_rules_on_the_normalized_policy_read_only() -> None:
    local = PolicyRegistry()
    seen: list[Mapping[str, Any]] = []

    @local.key("n", module="m")
    def double(value: object, ctx: PolicyContext, field: str) -> object:
        assert field == "policy.n"
        assert isinstance(value, int)
        return value * 2

    @local.rule(module="m")
    def look(policy: Mapping[str, Any], ctx: PolicyContext) -> None:
        seen.append(policy)
        with pytest.raises(TypeError):
            policy["n"] = 0  # type: ignore[index]

    assert local.validate({"n": 2}, CUSTOM) == {"n": 4}
    assert seen == [{"n": 4}]


# --- secrets: write-only (CONTRACT section 6, docs/decisions/0001) ----------------------

TOKEN = JOIN["token"]
STORED: dict[str, Any] = {"kubernetes": {**JOIN_SET, "labels": {"team": "ml"}}}
SHOWN: dict[str, Any] = {
    "kubernetes": {
        "apiServer": JOIN["apiServer"],
        "tokenSet": True,
        "caCertHash": HASH,
        "labels": {"team": "ml"},
    }
}


def test_the_module_that_owns_kubernetes_declares_its_token_secret() -> None:
    secrets = {key: [s.name for s in e.secrets] for key, e in registry.keys().items() if e.secrets}
    assert secrets == {"kubernetes": ["token"]}


def test_a_readable_policy_shows_token_set_in_place_of_the_token() -> None:
    stored = copy.deepcopy(STORED)
    shown = readable_policy(stored)
    assert shown == SHOWN
    assert list(shown["kubernetes"]) == ["apiServer", "tokenSet", "caCertHash", "labels"]
    assert TOKEN not in repr(shown)
    assert stored == STORED  # the stored policy is left as it is
    # Nothing to hide: nothing changes, and no tokenSet appears.
    labels_only = {"kubernetes": {"labels": {"a": "b"}}, "singleTenant": True}
    assert readable_policy(labels_only) == labels_only
    assert readable_policy({}) == {}


def test_token_set_sent_back_keeps_the_stored_token() -> None:
    edited = copy.deepcopy(SHOWN)
    edited["kubernetes"]["labels"] = {"team": "infra"}
    kept = validate_policy(edited, CUSTOM, STORED)
    assert kept == {"kubernetes": {**JOIN_SET, "labels": {"team": "infra"}}}
    assert readable_policy(validate_policy(SHOWN, CUSTOM, STORED)) == SHOWN  # a round trip


def test_a_new_token_replaces_the_stored_one() -> None:
    fresh = {**SHOWN["kubernetes"], "token": "zyxwvu.9876543210fedcba"}
    assert validate_policy({"kubernetes": fresh}, CUSTOM, STORED)["kubernetes"]["token"] == (
        "zyxwvu.9876543210fedcba"
    )
    without_marker = {**JOIN_SET, "token": "zyxwvu.9876543210fedcba"}
    assert validate_policy({"kubernetes": without_marker}, CUSTOM, STORED)["kubernetes"] == (
        without_marker
    )


def test_leaving_kubernetes_out_removes_the_token() -> None:
    assert validate_policy({"singleTenant": True}, CUSTOM, STORED) == {"singleTenant": True}


def test_token_set_false_keeps_nothing() -> None:
    labels_only = {"kubernetes": {"tokenSet": False, "labels": {"a": "b"}}}
    assert validate_policy(labels_only, CUSTOM, STORED) == {"kubernetes": {"labels": {"a": "b"}}}
    # With the rest of the join set, the join set is then incomplete.
    incomplete = {**SHOWN["kubernetes"], "tokenSet": False}
    with pytest.raises(InvalidInput) as info:
        validate_policy({"kubernetes": incomplete}, CUSTOM, STORED)
    assert info.value.field == "policy.kubernetes.token"


@pytest.mark.parametrize(
    ("stored", "moved", "field"),
    [
        (None, {}, "policy.kubernetes.tokenSet"),  # create: nothing stored
        ({}, {}, "policy.kubernetes.tokenSet"),
        ({"kubernetes": {"labels": {}}}, {}, "policy.kubernetes.tokenSet"),
        # The stored token goes only to the server and CA it was given for.
        (STORED, {"apiServer": "https://evil.example.com"}, "policy.kubernetes.token"),
        (STORED, {"caCertHash": "sha256:" + "f" * 64}, "policy.kubernetes.token"),
    ],
)
def test_token_set_without_a_token_to_keep_is_refused(
    stored: dict[str, Any] | None, moved: dict[str, str], field: str
) -> None:
    sent = {"kubernetes": {**SHOWN["kubernetes"], **moved}}
    with pytest.raises(InvalidInput) as info:
        validate_policy(sent, CUSTOM, stored)
    assert info.value.field == field
    assert TOKEN not in info.value.message


@pytest.mark.parametrize("marker", ["yes", 1, None, TOKEN])
def test_token_set_must_be_a_boolean(marker: object) -> None:
    sent = {"kubernetes": {**SHOWN["kubernetes"], "tokenSet": marker}}
    with pytest.raises(InvalidInput) as info:
        validate_policy(sent, CUSTOM, STORED)
    assert info.value.field == "policy.kubernetes.tokenSet"
    assert TOKEN not in info.value.message


def test_a_kept_token_still_needs_platform_operated_on_a_platform_site() -> None:
    with pytest.raises(InvalidInput) as info:
        validate_policy(SHOWN, PLATFORM, STORED)
    assert info.value.field == "policy.platformOperated"
    assert validate_policy({**SHOWN, "platformOperated": True}, PLATFORM, STORED) == {
        **STORED,
        "platformOperated": True,
    }
