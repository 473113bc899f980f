"""The container files, checked without a Docker engine.

A small Dockerfile parser (line continuations, comments, parser directives, JSON and shell
forms) checks the Dockerfile's structure; PyYAML reads the compose file; the versions the image
installs are compared with ``pyproject.toml``; the paths used in ``docker/README.md``'s commands
must exist; and no file of the container setup or the notebooks may hold a credential.
"""

from __future__ import annotations

import json
import glob
import os
import re
import shlex
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), ".."))
DOCKER = os.path.join(ROOT, "docker")
DOCKERFILE = os.path.join(DOCKER, "Dockerfile")
COMPOSE = os.path.join(DOCKER, "compose.yaml")
ENV_EXAMPLE = os.path.join(DOCKER, ".env.example")
DOCKER_README = os.path.join(DOCKER, "README.md")

INSTRUCTIONS = {"ADD", "ARG", "CMD", "COPY", "ENTRYPOINT", "ENV", "EXPOSE", "FROM", "HEALTHCHECK", "LABEL",
                "MAINTAINER", "ONBUILD", "RUN", "SHELL", "STOPSIGNAL", "USER", "VOLUME", "WORKDIR"}
SECRET_PATH = re.compile(r"(^|/)(\.aws|\.ssh|\.docker|\.netrc|\.env|credentials|id_rsa|id_ed25519)(/|$)|\.(pem|key|p12)$",
                         re.IGNORECASE)
SECRET_NAME = re.compile(r"SECRET|PASSWORD|PASSWD|TOKEN|ACCESS_KEY|PRIVATE_KEY|CREDENTIAL", re.IGNORECASE)


class DockerfileError(ValueError):
    pass


@dataclass
class Instruction:
    keyword: str
    value: str
    line: int

    @property
    def json_args(self) -> Optional[List[str]]:
        """The arguments of the exec (JSON array) form, or None for the shell form."""
        text = self.value.strip()
        if not text.startswith("["):
            return None
        try:
            args = json.loads(text)
        except ValueError:
            raise DockerfileError(f"line {self.line}: {self.keyword} looks like JSON but does not parse: {text}") from None
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise DockerfileError(f"line {self.line}: {self.keyword} JSON form must be an array of strings")
        return args


def parse_dockerfile(text: str) -> List[Instruction]:
    """Instructions of a Dockerfile: continuation lines joined, comments and directives dropped.

    Raises :class:`DockerfileError` for an unknown instruction, a dangling continuation, a
    heredoc (not supported here) or an instruction before the first ``FROM`` other than ``ARG``.
    """
    escape = "\\"
    lines = text.splitlines()
    # parser directives: only at the very top, before any other line
    for line in lines:
        m = re.match(r"#\s*(\w+)\s*=\s*(\S+)\s*$", line)
        if not m:
            break
        if m.group(1).lower() == "escape":
            escape = m.group(2)
    out: List[Instruction] = []
    current: Optional[List[str]] = None
    start = 0
    for number, raw in enumerate(lines, 1):
        stripped = raw.strip()
        if current is None:
            if not stripped or stripped.startswith("#"):
                continue
            current, start = [], number
        elif stripped.startswith("#"):  # comment lines inside a continued instruction are dropped
            continue
        if stripped.endswith(escape):
            current.append(stripped[: -len(escape)])
            continue
        current.append(stripped)
        joined = " ".join(part.strip() for part in current if part.strip())
        current = None
        keyword, _, value = joined.partition(" ")
        keyword = keyword.upper()
        if keyword not in INSTRUCTIONS:
            raise DockerfileError(f"line {start}: unknown instruction {keyword!r}")
        if re.search(r"<<-?\s*['\"]?[A-Za-z_]+", value) and keyword in ("RUN", "COPY"):
            raise DockerfileError(f"line {start}: heredocs are not supported by this checker")
        if not value.strip() and keyword != "ONBUILD":
            raise DockerfileError(f"line {start}: {keyword} has no arguments")
        out.append(Instruction(keyword, value.strip(), start))
    if current is not None:
        raise DockerfileError(f"line {start}: the file ends inside a continued instruction")
    if not out:
        raise DockerfileError("no instructions")
    first_from = next((i for i, ins in enumerate(out) if ins.keyword == "FROM"), None)
    if first_from is None:
        raise DockerfileError("no FROM instruction")
    if any(ins.keyword != "ARG" for ins in out[:first_from]):
        raise DockerfileError("only ARG may come before the first FROM")
    return out


def arg_defaults(instructions: List[Instruction]) -> Dict[str, str]:
    """``ARG NAME=default`` values."""
    args = {}
    for ins in instructions:
        if ins.keyword == "ARG":
            name, _, default = ins.value.partition("=")
            args[name.strip()] = default.strip().strip('"')
    return args


def env_values(instructions: List[Instruction]) -> Dict[str, str]:
    """The image's environment from ``ENV`` (``NAME=value ...`` and the legacy ``NAME value``)."""
    env = {}
    for ins in instructions:
        if ins.keyword != "ENV":
            continue
        words = shlex.split(ins.value)
        if words and "=" not in words[0]:
            env[words[0]] = " ".join(words[1:])
            continue
        for word in words:
            name, _, value = word.partition("=")
            env[name] = value
    return env


def substitute(text: str, args: Dict[str, str]) -> str:
    """Expand ``$NAME`` / ``${NAME}`` with build-argument defaults (others left as they are)."""
    return re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), text)


def dockerfile_problems(instructions: List[Instruction]) -> List[str]:
    """Policy checks on a parsed Dockerfile; an empty list means it passes."""
    problems = []
    users = [ins for ins in instructions if ins.keyword == "USER"]
    if not users:
        problems.append("no USER instruction: the image would run as root")
    elif users[-1].value.split(":")[0].strip() in ("root", "0"):
        problems.append(f"the final USER is root ({users[-1].value})")
    for kind in ("ENTRYPOINT", "HEALTHCHECK"):
        if not any(ins.keyword == kind for ins in instructions):
            problems.append(f"no {kind}")
    for ins in instructions:
        if ins.keyword == "ADD":
            problems.append(f"line {ins.line}: ADD (use COPY; ADD fetches URLs and unpacks archives)")
        if ins.keyword in ("ADD", "COPY"):
            parts = [p for p in shlex.split(ins.value) if not p.startswith("--")]
            for source in parts[:-1]:
                if "://" in source:
                    problems.append(f"line {ins.line}: {ins.keyword} from a URL: {source}")
                if SECRET_PATH.search(source):
                    problems.append(f"line {ins.line}: {ins.keyword} of a secret-looking path: {source}")
        if ins.keyword in ("ENV", "ARG"):
            for name in re.findall(r"(?:^|\s)([A-Za-z_][A-Za-z0-9_]*)(?==|\s|$)", ins.value):
                if SECRET_NAME.search(name):
                    problems.append(f"line {ins.line}: {ins.keyword} {name}: secrets must not be build arguments or "
                                    "image environment (docker history shows them)")
    return problems


@pytest.fixture(scope="module")
def dockerfile() -> List[Instruction]:
    with open(DOCKERFILE) as f:
        return parse_dockerfile(f.read())


@pytest.fixture(scope="module")
def pyproject() -> dict:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def requirement(pyproject: dict, name: str) -> Requirement:
    for spec in pyproject["project"]["dependencies"]:
        req = Requirement(spec)
        if req.name == name:
            return req
    raise AssertionError(f"{name} is not a dependency in pyproject.toml")


# -- the parser itself --------------------------------------------------------------------------

def test_parser_joins_continuations_and_skips_comments():
    text = "# syntax=docker/dockerfile:1\nARG BASE=x\nFROM $BASE\n# note\nRUN a \\\n  # inside\n  && b\nUSER 1000\n"
    parsed = parse_dockerfile(text)
    assert [(i.keyword, i.value) for i in parsed] == [("ARG", "BASE=x"), ("FROM", "$BASE"), ("RUN", "a && b"),
                                                      ("USER", "1000")]
    assert parsed[2].line == 5


@pytest.mark.parametrize("text, message", [
    ("RUN echo\nFROM x\n", "only ARG"),
    ("FROM x\nRUNN echo\n", "unknown instruction"),
    ("FROM x\nRUN a \\\n", "ends inside"),
    ("FROM x\nUSER\n", "no arguments"),
    ("FROM x\nRUN <<EOF\necho\nEOF\n", "heredocs"),
    ("# only a comment\n", "no instructions"),
])
def test_parser_rejects_broken_files(text, message):
    with pytest.raises(DockerfileError, match=message):
        parse_dockerfile(text)


def test_json_form_must_parse():
    entry = parse_dockerfile('FROM x\nENTRYPOINT ["a", \n')[-1]
    with pytest.raises(DockerfileError, match="does not parse"):
        entry.json_args
    assert parse_dockerfile('FROM x\nCMD ["a", "b"]\n')[-1].json_args == ["a", "b"]
    assert parse_dockerfile("FROM x\nCMD a b\n")[-1].json_args is None


def test_policy_catches_root_secrets_and_add():
    bad = parse_dockerfile("FROM x\nARG AWS_SECRET_ACCESS_KEY\nADD https://example.com/a.tgz /a\n"
                           "COPY .aws/credentials /root/.aws/credentials\nUSER root\n")
    problems = "\n".join(dockerfile_problems(bad))
    for expected in ("final USER is root", "no ENTRYPOINT", "no HEALTHCHECK", "ADD (use COPY", "from a URL",
                     "secret-looking path", "AWS_SECRET_ACCESS_KEY"):
        assert expected in problems
    assert dockerfile_problems(parse_dockerfile("FROM x\nUSER app\nENTRYPOINT [\"a\"]\nHEALTHCHECK CMD a\n")) == []


# -- the Dockerfile -------------------------------------------------------------------------------

def test_dockerfile_parses_and_passes_policy(dockerfile):
    assert dockerfile[0].keyword == "FROM"
    assert dockerfile_problems(dockerfile) == []
    assert sum(ins.keyword == "FROM" for ins in dockerfile) == 1


def test_base_image_is_cuda12_cudnn_runtime_on_ubuntu_lts(dockerfile):
    image = substitute(dockerfile[0].value.split()[0], arg_defaults(dockerfile))
    m = re.fullmatch(r"nvidia/cuda:(\d+)\.(\d+)\.(\d+)-cudnn-runtime-ubuntu(\d\d)\.(\d\d)", image)
    assert m, image
    assert m.group(1) == "12"  # nvidia-dali-cuda120 is the CUDA 12 build
    assert int(m.group(4)) % 2 == 0 and m.group(5) == "04", "Ubuntu LTS releases are even years, April"


def test_entrypoint_and_healthcheck_run_dalistream(dockerfile):
    entry = [ins for ins in dockerfile if ins.keyword == "ENTRYPOINT"][-1].json_args
    assert entry is not None, "ENTRYPOINT must use the exec form (signals reach the process)"
    assert entry[-1] == "dalistream"
    cmd = [ins for ins in dockerfile if ins.keyword == "CMD"][-1].json_args
    assert cmd and cmd[0] in ("demo", "--help")


SECONDS = {"s": 1, "m": 60, "h": 3600, "": 1}


def healthcheck(dockerfile):
    """The HEALTHCHECK's options (in seconds, retries as a count) and its command as an argument list."""
    health = [ins for ins in dockerfile if ins.keyword == "HEALTHCHECK"][-1].value
    options, _, command = health.partition("CMD")
    parsed = {}
    for option in shlex.split(options):
        m = re.fullmatch(r"--(interval|timeout|start-period|retries)=(\d+)([smh]?)", option)
        assert m, option
        parsed[m.group(1)] = int(m.group(2)) * (1 if m.group(1) == "retries" else SECONDS[m.group(3)])
    command = command.strip()
    return parsed, json.loads(command) if command.startswith("[") else shlex.split(command)


def test_healthcheck_is_cheap_and_checks_package_and_gpu(dockerfile):
    """A health check runs beside the real job: it must not train, decode or run a pipeline; it
    checks that dalistream imports and that DALI sees a GPU, often and with a short timeout."""
    options, command = healthcheck(dockerfile)
    text = " ".join(command)
    for costly in ("demo", "bench", "keys", "torchrun", "--steps", "train", "synth"):
        assert costly not in text, f"the HEALTHCHECK runs {costly!r}"
    assert command[:2] == ["python", "-c"] and len(command) == 3
    code = command[2]
    compile(code, "<healthcheck>", "exec")  # valid Python
    assert re.search(r"\bimport dalistream\b", code) and "GetCUDADeviceCount() > 0" in code
    assert 30 <= options["interval"] <= 600 and options["timeout"] <= 60 and options["timeout"] < options["interval"]
    assert options.get("retries", 3) >= 2  # one slow answer under load is not "unhealthy"


def test_env_parser_reads_both_forms():
    parsed = parse_dockerfile('FROM x\nENV A=1 B="two words" \\\n    C=3\nENV D four five\n')
    assert env_values(parsed) == {"A": "1", "B": "two words", "C": "3", "D": "four five"}


def test_driver_capabilities_include_video_for_the_hardware_jpeg_decoder(dockerfile):
    """The CUDA base image grants the container "compute,utility"; nvImageCodec's A100/H100
    hardware JPEG decoder needs the driver's video libraries too, else it falls back in silence."""
    capabilities = env_values(dockerfile).get("NVIDIA_DRIVER_CAPABILITIES", "")
    assert {"compute", "utility", "video"} <= set(capabilities.split(",")) or capabilities == "all", capabilities
    with open(DOCKER_README, encoding="utf-8") as f:
        text = f.read()
    assert "NVIDIA_DRIVER_CAPABILITIES" in text and "video" in text and "hardware" in text


def test_user_is_created_non_root(dockerfile):
    user = [ins for ins in dockerfile if ins.keyword == "USER"][-1].value
    args = arg_defaults(dockerfile)
    runs = " ".join(substitute(ins.value, args) for ins in dockerfile if ins.keyword == "RUN")
    assert re.search(rf"useradd\b[^&]*\b{re.escape(user)}\b", runs), f"USER {user} is never created"
    assert int(args["UID"]) > 0


def test_versions_agree_with_pyproject(dockerfile, pyproject):
    args = arg_defaults(dockerfile)
    runs = [ins.value for ins in dockerfile if ins.keyword == "RUN"]
    # DALI 2.x loads NPP and cuFFT from the base image: the build fails early if they are missing
    assert any("GetNppVersion()" in run and "GetCufftVersion()" in run for run in runs)
    dali = requirement(pyproject, "nvidia-dali-cuda120")
    assert args["DALI_VERSION"] in dali.specifier, (args["DALI_VERSION"], str(dali.specifier))
    assert any('"nvidia-dali-cuda120==${DALI_VERSION}"' in run for run in runs)
    torch = requirement(pyproject, "torch")
    assert args["TORCH_VERSION"] in torch.specifier, (args["TORCH_VERSION"], str(torch.specifier))
    assert any('"torch==${TORCH_VERSION}"' in run for run in runs)
    assert re.fullmatch(r"https://download\.pytorch\.org/whl/cu12\d", args["TORCH_INDEX_URL"])
    # the torch version the README installs is the one in the image
    with open(os.path.join(ROOT, "README.md")) as f:
        pins = set(re.findall(r'"torch==([\w.+]+)"', f.read()))
    assert pins <= {args["TORCH_VERSION"]}, pins
    python = re.fullmatch(r"python(\d+\.\d+)", args["PYTHON"])
    assert python and python.group(1) in SpecifierSet(pyproject["project"]["requires-python"])
    # dalistream itself from the copied sources, with pyproject's own dependency pins
    assert any(re.search(r"\bpip install\b.*\s\.(\s|$)", run) for run in runs)
    assert os.path.basename(pyproject["project"]["name"]) == "dalistream"


def test_copied_sources_exist_and_pass_the_dockerignore(dockerfile):
    with open(DOCKERFILE + ".dockerignore") as f:
        ignore = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    assert ignore[0] == "**", "the build context is the whole repository: send only what the image copies"
    allowed = {line[1:].split("/")[0] for line in ignore if line.startswith("!")}
    for ins in dockerfile:
        if ins.keyword == "COPY":
            parts = [p for p in shlex.split(ins.value) if not p.startswith("--")]
            for source in parts[:-1]:
                assert os.path.exists(os.path.join(ROOT, source)), source
                assert source.rstrip("/").split("/")[0] in allowed, f"{source} is excluded by the .dockerignore"


# -- compose ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def compose() -> dict:
    with open(COMPOSE) as f:
        return yaml.safe_load(f)


def env_example() -> Dict[str, str]:
    values = {}
    with open(ENV_EXAMPLE) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                name, _, value = line.partition("=")
                values[name] = value
    return values


VARIABLE = re.compile(r"\$\$|\$\{(\w+)(?::?-([^}]*))?\}|\$(\w+)")


def interpolate(value, env: Dict[str, str]):
    """Compose's variable interpolation (``${X:-default}``, ``$$`` for a literal ``$``)."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(m):
        if m.group(0) == "$$":
            return "$"
        name = m.group(1) or m.group(3)
        return env.get(name, m.group(2) or "")

    return VARIABLE.sub(one, value)


def variables(value) -> Dict[str, Optional[str]]:
    """Every variable compose would interpolate in ``value``, with its inline default."""
    found: Dict[str, Optional[str]] = {}
    if isinstance(value, dict):
        for v in value.values():
            found.update(variables(v))
    elif isinstance(value, list):
        for v in value:
            found.update(variables(v))
    elif isinstance(value, str):
        for m in VARIABLE.finditer(value):
            if m.group(0) != "$$":
                found[m.group(1) or m.group(3)] = m.group(2)
    return found


COMPOSE_TOP = {"version", "name", "include", "services", "networks", "volumes", "secrets", "configs", "models"}
COMPOSE_SERVICE = set("""
annotations attach build blkio_config cap_add cap_drop cgroup cgroup_parent command configs container_name
cpu_count cpu_percent cpu_shares cpu_quota cpu_period cpu_rt_period cpu_rt_runtime cpus cpuset credential_spec
depends_on deploy develop device_cgroup_rules devices dns dns_opt dns_search domainname entrypoint env_file
environment expose extends external_links extra_hosts gpus group_add healthcheck hostname image init ipc isolation
labels label_file links logging mac_address mem_limit mem_reservation mem_swappiness memswap_limit models
network_mode networks oom_kill_disable oom_score_adj pid pids_limit platform ports post_start pre_stop privileged
profiles provider pull_policy read_only restart runtime scale secrets security_opt shm_size stdin_open
stop_grace_period stop_signal storage_opt sysctls tmpfs tty ulimits use_api_socket user userns_mode uts volumes
volumes_from working_dir""".split())


def test_compose_keys_are_known(compose):
    """Keys of the Compose specification only (a typo would be rejected, or silently ignored)."""
    assert set(k for k in compose if not k.startswith("x-")) <= COMPOSE_TOP
    for name, service in compose["services"].items():
        unknown = {k for k in service if not k.startswith("x-")} - COMPOSE_SERVICE
        assert not unknown, f"service {name}: unknown keys {unknown}"
        assert "image" in service
        for key in ("command", "entrypoint"):
            assert isinstance(service.get(key, []), list), f"{name}.{key}: use the list form (no shell word splitting)"


def test_compose_services_and_order(compose):
    services = compose["services"]
    assert set(services) == {"minio", "shards", "upload", "trainer"}
    assert services["upload"]["depends_on"] == {"minio": {"condition": "service_healthy"},
                                                "shards": {"condition": "service_completed_successfully"}}
    assert services["trainer"]["depends_on"] == {"upload": {"condition": "service_completed_successfully"}}
    assert "healthcheck" in services["minio"]
    assert set(compose["volumes"]) == {"minio-data", "shards"}


def test_compose_trainer_has_a_gpu_and_shared_memory(compose):
    trainer = compose["services"]["trainer"]
    devices = trainer["deploy"]["resources"]["reservations"]["devices"]
    assert any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []) for d in devices)
    assert trainer.get("shm_size") or trainer.get("ipc") == "host"
    build = trainer["build"]
    context = os.path.normpath(os.path.join(DOCKER, build["context"]))
    assert context == ROOT
    assert os.path.isfile(os.path.join(context, build["dockerfile"]))


def test_compose_runs_the_s3_path(compose):
    env = env_example()
    services = interpolate(compose["services"], {})  # the defaults written in compose.yaml
    assert services == interpolate(compose["services"], env), "docker/.env.example must repeat compose's defaults"
    bucket = env["DALISTREAM_BUCKET"]
    shards = " ".join(services["shards"]["command"])
    assert "dalistream synth /data/shards/train" in shards
    upload = " ".join(services["upload"]["command"])
    assert "mc mirror --overwrite /data/shards \"local/$BUCKET\"" in upload and services["upload"]["environment"]["BUCKET"] == bucket
    command = services["trainer"]["command"]
    assert command[0] == "demo"
    assert command[command.index("--data") + 1] == f"s3://{bucket}/train/"
    assert command[command.index("--endpoint-url") + 1] == "http://minio:9000"
    trainer_env = services["trainer"]["environment"]
    minio_env = services["minio"]["environment"]
    assert trainer_env["AWS_ACCESS_KEY_ID"] == minio_env["MINIO_ROOT_USER"]
    assert trainer_env["AWS_SECRET_ACCESS_KEY"] == minio_env["MINIO_ROOT_PASSWORD"]
    assert len(minio_env["MINIO_ROOT_PASSWORD"]) >= 8  # MinIO refuses shorter ones
    for port in services["minio"]["ports"]:
        assert port.startswith("127.0.0.1:"), f"MinIO must not listen on every interface: {port}"


def test_compose_credentials_are_local_placeholders(compose):
    found = variables(compose)
    documented = env_example()
    assert set(found) <= set(documented), f"undocumented variables: {set(found) - set(documented)}"
    for service in compose["services"].values():
        for name, value in (service.get("environment") or {}).items():
            if SECRET_NAME.search(name) or name in ("AWS_ACCESS_KEY_ID", "MINIO_ROOT_USER"):
                m = re.fullmatch(r"\$\{(\w+):-([^}]*)\}", str(value))
                assert m, f"{name} must come from a variable with a default, not a literal: {value!r}"
                assert "local" in m.group(2), f"{name}: the default must read as local-only: {m.group(2)!r}"
    for name, value in documented.items():
        if SECRET_NAME.search(name):
            assert "local" in value


# -- the README's commands ----------------------------------------------------------------------

def shell_commands(markdown: str) -> List[List[str]]:
    """The commands of the ``bash``/``sh`` code blocks, split like a shell would."""
    commands = []
    for block in re.findall(r"```(?:bash|sh|console)\n(.*?)```", markdown, re.DOTALL):
        text = re.sub(r"\\\n", " ", block)
        for line in text.splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                for part in re.split(r"\s*(?:&&|\|\||;|\|)\s*", line):
                    if part:
                        commands.append(shlex.split(part))
    return commands


def repo_paths(command: List[str]) -> List[str]:
    """Arguments of ``command`` that name files in the repository (relative paths)."""
    args = command[1:-1] if command[0] == "cp" else command[1:]  # cp's destination may be new
    out = []
    for arg in args:
        for piece in re.split(r"[=:]", arg) if not arg.startswith(("http://", "https://", "s3://")) else []:
            if (not piece or piece.startswith(("-", "/", "~", "$", '"')) or "://" in piece or "${" in piece
                    or piece.startswith("dalistream:")):
                continue
            if piece == "." or "/" in piece or re.search(r"\.(py|ya?ml|toml|md|ipynb|example|txt|json)$|^Dockerfile", piece):
                out.append(piece)
    return out


def test_docker_readme_commands_use_existing_paths():
    with open(DOCKER_README) as f:
        text = f.read()
    commands = shell_commands(text)
    assert any(c[:2] == ["docker", "build"] for c in commands)
    assert any(c[:2] == ["docker", "compose"] and "up" in c for c in commands)
    assert any(c[:2] == ["docker", "run"] and "--gpus" in c and "all" in c for c in commands)
    checked = []
    for command in commands:
        for path in repo_paths(command):
            checked.append(path)
            assert os.path.exists(os.path.join(ROOT, path)), f"{' '.join(command)}: {path} does not exist in the repo"
    assert {"docker/Dockerfile", "docker/compose.yaml", ".", "docker/.env.example"} <= set(checked), checked
    # relative links from the README (docker/README.md) to files of the repo
    for link in re.findall(r"\]\((?!https?://)([^)#]+)(?:#[^)]*)?\)", text):
        assert os.path.exists(os.path.join(DOCKER, link)), link


def test_readme_path_checker_is_not_vacuous():
    assert repo_paths(shlex.split("docker compose -f docker/nope.yaml up")) == ["docker/nope.yaml"]
    assert repo_paths(shlex.split('docker run -v "$HOME/.aws":/home/x/.aws:ro -v /data:/data img demo')) == []
    assert repo_paths(shlex.split("cp docker/.env.example docker/.env")) == ["docker/.env.example"]


# -- secrets ------------------------------------------------------------------------------------

ACCESS_KEY = re.compile(r"\b(AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}\b")
SECRET_ASSIGNMENT = re.compile(r"(?i)(aws_secret_access_key|secret_access_key|aws_session_token)[\"']?\s*[:=]\s*[\"']?([^\s\"',}]+)")
PRIVATE_KEY = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")


def looks_real(value: str) -> bool:
    """A 40-character AWS-style secret (or any long random-looking token), not a placeholder or a variable."""
    if value.startswith(("$", "<", "{")) or value.upper() == value and value.replace("_", "").isalpha():
        return False
    return bool(re.fullmatch(r"[A-Za-z0-9/+=]{30,}", value)) and bool(re.search(r"\d", value))


def scanned_files() -> List[str]:
    files = [os.path.join(DOCKER, name) for name in sorted(os.listdir(DOCKER))]
    notebooks = os.path.join(ROOT, "notebooks")
    if os.path.isdir(notebooks):
        files += [os.path.join(notebooks, n) for n in sorted(os.listdir(notebooks)) if n.endswith((".ipynb", ".py", ".md"))]
    docs = os.path.join(ROOT, "docs")
    files += sorted(glob.glob(os.path.join(docs, "**", "*.md"), recursive=True) + glob.glob(os.path.join(docs, "recipes", "*.py")))
    return files + [os.path.join(ROOT, "README.md"), os.path.join(ROOT, "pyproject.toml")]


def secret_findings(text: str) -> List[str]:
    found = [m.group(0) for m in ACCESS_KEY.finditer(text)]
    found += [m.group(0) for m in PRIVATE_KEY.finditer(text)]
    found += [m.group(0) for m in SECRET_ASSIGNMENT.finditer(text) if looks_real(m.group(2))]
    return found


def test_secret_scanner_is_not_vacuous():
    fake_id = "AKIA" + "ABCDEFGHIJ234567"
    fake_secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCY" + "3EXAMPLEKEY"
    assert secret_findings(f"aws_access_key_id = {fake_id}\n")
    assert secret_findings(f"aws_secret_access_key={fake_secret}\n")
    assert secret_findings(f'"AWS_SECRET_ACCESS_KEY": "{fake_secret}"')
    assert not secret_findings('AWS_SECRET_ACCESS_KEY: ${MINIO_ROOT_PASSWORD:-dalistream-local-only}\n'
                               '"AWS_SECRET_ACCESS_KEY": "testing"\naws_secret_access_key=$SECRET\n')


@pytest.mark.parametrize("path", scanned_files(), ids=lambda p: os.path.relpath(p, ROOT))
def test_no_secrets_in_files(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    assert secret_findings(text) == []


def test_main_readme_links_to_the_container_and_notebooks():
    """The README links to the docs' pages on the container, the notebooks and the GPU install,
    and those pages name files that exist (the docs site cannot link outside docs/)."""
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    links = set(re.findall(r"\]\((docs/[^)#]+)", text))
    assert {"docs/guide/container.md", "docs/guide/notebooks.md", "docs/guide/gpu.md"} <= links
    named = set()
    for link in links:
        assert os.path.exists(os.path.join(ROOT, link)), link
        with open(os.path.join(ROOT, link)) as f:
            named |= set(re.findall(r"`((?:docker|notebooks)/[\w./-]+)`", f.read()))
    assert {"docker/README.md", "notebooks/quickstart.ipynb", "notebooks/s3_streaming.ipynb"} <= named
    for path in named:
        assert os.path.exists(os.path.join(ROOT, path.rstrip("/"))), path
    with open(os.path.join(ROOT, "docs", "guide", "gpu.md")) as f:
        gpu = f.read()
    assert "## Install" in gpu and '".[gpu]"' in gpu


# the minimum driver of each CUDA 12 minor release (NVIDIA's CUDA release notes, table 3: Linux x86_64)
DRIVER_FOR_CUDA = {"12.0": 525.60, "12.1": 530.30, "12.2": 535.54, "12.3": 545.23, "12.4": 550.54, "12.5": 555.42,
                   "12.6": 560.28, "12.8": 570.26, "12.9": 575.51}


def test_driver_statements_agree_with_the_base_image(dockerfile):
    """The container's driver minimum follows from its base image's CUDA version, and every place
    that states it (docker/README.md, the docs' container and GPU pages, the Dockerfile's own header,
    pyproject's ``gpu`` extra) says the same."""
    base = [ins for ins in dockerfile if ins.keyword == "FROM"][0].value
    cuda = re.search(r"nvidia/cuda:(\d+\.\d+)", base).group(1)
    need = int(DRIVER_FOR_CUDA[cuda])
    for path in (os.path.join(DOCKER, "README.md"), os.path.join(ROOT, "docs", "guide", "container.md"),
                 os.path.join(ROOT, "docs", "guide", "gpu.md"), os.path.join(DOCKER, "Dockerfile"),
                 os.path.join(ROOT, "pyproject.toml")):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        assert re.search(rf"(?:≥|>=) ?{need}\b", text), f"{path} does not state the driver minimum {need} (CUDA {cuda})"
    with open(os.path.join(DOCKER, "README.md"), encoding="utf-8") as f:
        assert f"CUDA {cuda}" in f.read()


def test_readme_describes_the_health_check_as_it_is(dockerfile):
    _, command = healthcheck(dockerfile)
    with open(os.path.join(ROOT, "docs", "guide", "container.md"), encoding="utf-8") as f:
        container = f.read()
    assert "health check" in container and "demo --steps" not in container
    assert "GetCUDADeviceCount" in " ".join(command) and "sees a GPU" in container
