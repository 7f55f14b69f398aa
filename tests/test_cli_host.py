import pytest

from esper_ray.cli import main


def test_host_command_lists_slots_and_blueprint_sizes(capsys):
    assert main(["host", "--task", "cifar10"]) == 0
    out = capsys.readouterr().out
    assert "host cifar10 (cnn): 6,418 parameters" in out and "r1c2" in out and "18,560" in out


def test_host_command_shows_the_transformer_and_its_seeds(capsys):
    assert main(["host", "--task", "text"]) == 0
    out = capsys.readouterr().out
    assert "host text (transformer): 170,560 parameters" in out and "lora_large" in out and "64 x 64" in out


def test_host_command_shows_the_default_tasks_host_and_a_text_host_preset(capsys):
    assert main(["host"]) == 0  # the task `train` and `heuristic` default to
    assert capsys.readouterr().out.startswith("host digits-impaired (cnn): 160 parameters")
    assert main(["host", "--task", "text", "--host-preset", "text-starved"]) == 0  # as `heuristic --host-preset`
    assert capsys.readouterr().out.startswith("host text-starved (transformer): 170,560 parameters")


def test_a_host_preset_of_another_task_is_refused_naming_what_the_task_takes(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["host", "--task", "digits", "--host-preset", "text-gpu"])
    assert exit_info.value.code == 2 and "task digits takes one of ['digits']" in capsys.readouterr().err
