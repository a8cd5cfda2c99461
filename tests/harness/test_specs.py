"""Harness specs and configs: Hydra composition with provider overrides, the impossible pairs,
pinned versions, the config each CLI gets, the install command, and a harness timeout."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import tomllib

import pytest
from fixture_paths import CONF
from hydra import compose, initialize_config_dir
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from recipes import tiny

from polar_pl.harness import HARNESSES, build_harness
from polar_pl.harness.base import NODE_VERSION, node_binary, node_installed
from polar_pl.harness.protocol import GatewaySession, Harness, LaunchPlan, SandboxPaths
from polar_pl.harness.run import run_harness

SESSION = GatewaySession(base_url="http://127.0.0.1:9/s/tok-123", token="tok-123", model="m-1")
PATHS = SandboxPaths(workdir="/w", home="/h", harness_prefix="/p", python=("python3",))

SUPPORTED = {
    "mini": ["openai_chat"],
    "claude_code": ["anthropic"],
    "codex": ["openai_responses"],
    "qwen_code": ["openai_chat", "anthropic", "openai_responses"],
    "pi": ["openai_chat", "openai_responses", "anthropic", "google"],
    "gemini_cli": ["google"],
    "opencode": ["openai_chat", "anthropic", "openai_responses"],
}
ALL = ("anthropic", "openai_chat", "openai_responses", "google")


def _harness(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=tiny(*overrides))
    return instantiate(cfg.harness)


@pytest.mark.parametrize("name", list(SUPPORTED))
def test_each_harness_composes_with_its_default_provider(name):
    h = _harness(f"harness={name}")
    assert isinstance(h, Harness) and h.name == name
    assert h.provider == SUPPORTED[name][0]


@pytest.mark.parametrize(
    ("name", "provider"), [(n, p) for n, ps in SUPPORTED.items() for p in ALL if p in ps]
)
def test_supported_provider_pairs(name, provider):
    assert _harness(f"harness={name}", f"provider={provider}").provider == provider


@pytest.mark.parametrize(
    ("name", "provider"), [(n, p) for n, ps in SUPPORTED.items() for p in ALL if p not in ps]
)
def test_impossible_pairs_name_both(name, provider):
    with pytest.raises((ValueError, InstantiationException)) as err:
        _harness(f"harness={name}", f"provider={provider}")
    assert f"harness={name}" in str(err.value) and f"provider={provider}" in str(err.value)


@pytest.mark.parametrize("name", list(SUPPORTED))
def test_debug_fast_composes_with_every_harness(name):
    """`debug=fast` set the mini agent's max_turns / max_tokens and crashed every CLI harness
    (`unexpected keyword argument 'max_turns'`)."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            config_name="config", overrides=tiny(f"harness={name}", "debug=fast"), return_hydra_config=True
        )
    assert instantiate(cfg.harness).name == name
    assert cfg.datamodule.gateway_options.max_tokens_cap == 8 and cfg.steps == 2


def _composed(*overrides: str, monkeypatch=None):
    from hydra.core.hydra_config import HydraConfig

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=tiny(*overrides), return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    return cfg


@pytest.mark.parametrize("name", [n for n in SUPPORTED if n != "mini"])
def test_cli_tiny_recipe_comes_from_its_experiment(name, monkeypatch):
    """The tiny model's CPU recipe for CLIs (experiment=cli_tiny) wins over the datamodule's: the
    CLI's warm-started model, group size, timeout, response cap and cap policy."""
    monkeypatch.setenv("POLAR_MODEL_CACHE", "/models")
    cfg = _composed(f"harness={name}", "experiment=cli_tiny")
    assert cfg.warm_start.harness == name and cfg.model_dir == f"/models/tiny-model-{name}"
    assert cfg.datamodule.group_size == 4 and cfg.datamodule.pools.run_timeout_s == 600
    assert cfg.datamodule.options.timeout_policy == "mask"
    assert cfg.datamodule.gateway_options.cap_policy == "end_turn" and cfg.module.lr == 1e-2


@pytest.mark.parametrize("name", list(SUPPORTED))
def test_a_harness_only_says_how_to_launch_its_cli(name, monkeypatch):
    """`module=grpo_gpu harness=claude_code` (the README's GPU line) trained at the harness conf's
    tiny-model lr 1e-2 on a 64-token cap: a harness group now sets nothing but the harness, so the
    module, cap and model are the ones chosen elsewhere: grpo_gpu's (without the default
    recipe: `~experiment`), the real-model experiment's."""
    monkeypatch.setenv("POLAR_MODEL_CACHE", "/models")
    base = _composed("~experiment", "module=grpo_gpu")
    cfg = _composed("~experiment", f"harness={name}", "module=grpo_gpu")
    assert cfg.module.lr == 1e-6 and cfg.module.weight_decay == 0.01
    assert cfg.datamodule == base.datamodule and cfg.model_dir == base.model_dir and cfg.warm_start is None
    for experiment in ("smollm2", "smollm2_tools"):
        real = _composed(f"experiment={experiment}", f"harness={name}")
        # (read before the next compose: `${hydra:runtime.choices.harness}` resolves against the last one)
        if experiment == "smollm2":
            assert real.model_dir == "/models/smollm2-135m-instruct" and real.pretrained == "smollm2"
        else:  # the pretrained model after the tool-use cold start inside this CLI's request
            assert real.model_dir == f"/models/smollm2-135m-instruct-{name}-tools"
            assert real.warm_start.base == "/models/smollm2-135m-instruct" and real.warm_start.harness == name
        alone = _composed(f"experiment={experiment}")
        assert real.module.lr == alone.module.lr and real.module.lr < 1e-4
        assert real.datamodule == alone.datamodule and real.datamodule.gateway_options.max_tokens_cap < 128
        assert instantiate(real.harness).name == name


def test_unknown_names_are_value_errors():
    with pytest.raises(ValueError, match="allowed values"):
        build_harness("cursor")
    with pytest.raises(ValueError, match="allowed values"):
        build_harness("pi", provider="bedrock")


@pytest.mark.parametrize("name", [n for n in HARNESSES if n != "mini"])
def test_yaml_pins_match_the_specs(name):
    h = _harness(f"harness={name}")
    assert h.version == type(h).pinned and h.version[0].isdigit()


@pytest.mark.parametrize("name", [n for n in HARNESSES if n != "mini"])
def test_the_pinned_version_installs_from_its_lockfile(name):
    """A fresh install is the tree that was tested: its lockfile names the pinned package at the
    pinned version, with every dependency resolved (a range once resolved to a version the
    registry did not serve yet and every fresh `make test` failed). Another version has none."""
    h = build_harness(name)
    lock = json.loads(h.lockfile().read_text())
    assert lock["packages"][""]["dependencies"] == {h.package: h.pinned}
    assert lock["packages"][f"node_modules/{h.package}"]["version"] == h.pinned
    assert all(p["version"] for k, p in lock["packages"].items() if k)
    assert build_harness(name, version="0.0.1").lockfile() is None


def test_codex_config_points_at_the_session():
    plan = build_harness("codex").plan(SESSION, "do it", PATHS)
    cfg = tomllib.loads(plan.files["/h/.codex/config.toml"].decode())
    assert cfg["model"] == "m-1" and cfg["model_provider"] == "polar"
    provider = cfg["model_providers"]["polar"]
    assert provider["base_url"] == "http://127.0.0.1:9/s/tok-123/v1" and provider["wire_api"] == "responses"
    assert plan.env["POLAR_API_KEY"] == "tok-123" and plan.env["CODEX_HOME"] == "/h/.codex"
    assert cfg["analytics"]["enabled"] is False
    assert (
        plan.argv[:2] == ("/p/node/bin/node", "/p/codex/node_modules/.bin/codex") and plan.argv[-1] == "do it"
    )


@pytest.mark.parametrize("name", [n for n in SUPPORTED if n != "mini"])
def test_node_clis_start_on_the_prefixs_node_and_native_ones_alone(name, harness_prefix):
    """A Node CLI runs on the prefix's Node (NODE_VERSION, whatever `node` the machine has), an
    executable npm installed natively runs by itself; which is which is read from the install."""
    h = build_harness(name)
    exe = f"/p/{name}/node_modules/.bin/{h.bin}"
    argv = h.plan(SESSION, "t", PATHS).argv
    assert argv[: 1 + h.on_node] == (("/p/node/bin/node", exe) if h.on_node else (exe,))
    installed = h.home_dir(harness_prefix) / "node_modules" / ".bin" / h.bin
    if not installed.exists():
        pytest.skip(f"{name} not installed")
    assert (installed.read_bytes()[:2] == b"#!") == h.on_node


def test_the_prefix_holds_the_pinned_node_and_a_prefix_without_it_is_named(harness_prefix, tmp_path):
    if not node_installed(harness_prefix):
        pytest.skip("no Node under the harness prefix (polar-pl harness install all)")
    out = subprocess.run(
        [node_binary(harness_prefix), "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == f"v{NODE_VERSION}"
    pi = build_harness("pi")  # installed, as far as npm's files go, but without its Node
    (tmp_path / "pi" / "node_modules" / ".bin").mkdir(parents=True)
    (tmp_path / "pi" / "node_modules" / ".bin" / "pi").write_text("#!/usr/bin/env node\n")
    (tmp_path / "pi" / "node_modules" / pi.package).mkdir(parents=True)
    (tmp_path / "pi" / "node_modules" / pi.package / "package.json").write_text(
        json.dumps({"version": pi.version})
    )
    assert not pi.is_installed(tmp_path)
    assert (
        pi.prefix_problem(tmp_path)
        == f"is {tmp_path}, which does not hold Node.js {NODE_VERSION} (node/bin/node)"
    )
    assert build_harness("claude_code").prefix_problem(tmp_path) == (
        f"is {tmp_path}, which does not hold @anthropic-ai/claude-code {build_harness('claude_code').version}"
    )


@pytest.mark.parametrize(
    ("provider", "api", "base"),
    [
        ("openai_chat", "openai-completions", "http://127.0.0.1:9/s/tok-123/v1"),
        ("openai_responses", "openai-responses", "http://127.0.0.1:9/s/tok-123/v1"),
        ("anthropic", "anthropic-messages", "http://127.0.0.1:9/s/tok-123"),
        ("google", "google-generative-ai", "http://127.0.0.1:9/s/tok-123"),
    ],
)
def test_pi_models_json_per_provider(provider, api, base):
    plan = build_harness("pi", provider=provider).plan(SESSION, "t", PATHS)
    polar = json.loads(plan.files["/h/.pi/agent/models.json"])["providers"]["polar"]
    assert (polar["api"], polar["baseUrl"], polar["models"][0]["id"]) == (api, base, "m-1")
    assert plan.env["POLAR_API_KEY"] == "tok-123" and plan.env["PI_OFFLINE"] == "1"


def test_claude_code_and_gemini_env():
    claude = build_harness("claude_code").plan(SESSION, "t", PATHS).env
    assert claude["ANTHROPIC_BASE_URL"] == SESSION.base_url and claude["ANTHROPIC_API_KEY"] == "tok-123"
    assert claude["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1" and claude["DISABLE_AUTOUPDATER"] == "1"
    gemini = build_harness("gemini_cli").plan(SESSION, "t", PATHS)
    assert (
        gemini.env["GOOGLE_GEMINI_BASE_URL"] == SESSION.base_url and gemini.env["GEMINI_API_KEY"] == "tok-123"
    )
    settings = json.loads(gemini.files["/h/.gemini/settings.json"])
    assert settings["privacy"]["usageStatisticsEnabled"] is False
    assert "-m" in gemini.argv  # a pinned model skips the router call


@pytest.mark.parametrize("provider", SUPPORTED["opencode"])
def test_opencode_config_per_provider(provider):
    plan = build_harness("opencode", provider=provider).plan(SESSION, "t", PATHS)
    cfg = json.loads(plan.files[plan.env["OPENCODE_CONFIG"]])
    polar = cfg["provider"]["polar"]
    assert polar["options"]["baseURL"] == "http://127.0.0.1:9/s/tok-123/v1"
    assert cfg["model"] == "polar/m-1" and cfg["autoupdate"] is False
    assert polar["npm"].startswith("@ai-sdk/")


def test_qwen_auth_type_follows_provider():
    plan = build_harness("qwen_code", provider="anthropic").plan(SESSION, "t", PATHS)
    assert plan.argv[plan.argv.index("--auth-type") + 1] == "anthropic"
    assert plan.env["ANTHROPIC_BASE_URL"] == SESSION.base_url
    plan = build_harness("qwen_code").plan(SESSION, "t", PATHS)
    assert plan.env["OPENAI_BASE_URL"] == SESSION.base_url + "/v1"


def test_a_harness_without_prefix_is_a_clear_error():
    with pytest.raises(ValueError, match="harness prefix"):
        build_harness("pi").plan(SESSION, "t", SandboxPaths(workdir="/w", home="/h", harness_prefix=None))


def test_install_cli_is_idempotent_and_fast(harness_prefix):
    if not all(build_harness(n).is_installed(harness_prefix) for n in HARNESSES):
        pytest.skip("harnesses not installed (polar-pl harness install all)")
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "polar_pl.cli", "harness", "install", "all", "--prefix", str(harness_prefix)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert time.monotonic() - t0 < 15
    assert out.stdout.count("already installed") == len(HARNESSES)


def test_install_cli_rejects_unknown_names(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "polar_pl.cli", "harness", "install", "cursor", "--prefix", str(tmp_path)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert out.returncode == 2 and "unknown harness 'cursor'" in out.stderr and "Traceback" not in out.stderr


def test_install_all_without_node_skips_node_clis(tmp_path):
    """`make test` calls `install all`: on a machine without Node only mini is usable, not an error."""
    out = subprocess.run(
        [sys.executable, "-m", "polar_pl.cli", "harness", "install", "all", "--prefix", str(tmp_path)],
        capture_output=True, text=True, check=False, env={"PATH": "/nonexistent"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("skipped, npm (Node.js) is not installed") == len(HARNESSES) - 1


class Sleeper:
    """A bring-your-own harness that never finishes (for the timeout path)."""

    name = "sleeper"
    provider = "openai_chat"
    policy_exit_codes: dict[int, str] = {}

    def is_installed(self, prefix):
        return True

    def install(self, prefix):
        pass

    def plan(self, session, prompt, paths):
        script = f"{paths.home}/agent.sh"
        return LaunchPlan(
            argv=("bash", script),
            files={script: b"echo started; (sleep 3131 &) ; sleep 3132\n"},
            log_dirs=(paths.home,),
        )

    def answer(self, stdout, answer_file_text):
        return None


def test_run_harness_timeout_kills_and_still_collects(tmp_path):
    from polar_pl.sandbox.local import LocalSandbox
    from polar_pl.testing.sandbox import OWNER

    with LocalSandbox(owner=OWNER) as sb:
        t0 = time.monotonic()
        # 3 s: a loaded machine may take over a second to start the script and print its line
        res = run_harness(Sleeper(), sb, SESSION, "never ends", timeout=3.0)
        assert res.timed_out and not res.ok and time.monotonic() - t0 < 20
        assert res.stdout == "started\n" and "agent.sh" in res.log and res.patch == ""


def test_node_installs_running_at_once_both_land(tmp_path):
    """`make test` installs pi's CLI beside other steps: two installs of the Node binary into one
    prefix at once both succeed and leave one working Node."""
    from concurrent.futures import ThreadPoolExecutor

    from polar_pl.harness.base import install_node

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(install_node, [tmp_path, tmp_path]))
    out = subprocess.run([node_binary(tmp_path), "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"v{NODE_VERSION}" and node_installed(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["node"]  # no download left behind
