from esper_ray.cli import main


def test_host_command_lists_slots_and_blueprint_sizes(capsys):
    assert main(["host", "--task", "cifar10"]) == 0
    out = capsys.readouterr().out
    assert "host cifar10 (cnn): 6,418 parameters" in out and "r1c2" in out and "18,560" in out


def test_host_command_shows_the_transformer_and_its_seeds(capsys):
    assert main(["host", "--task", "text"]) == 0
    out = capsys.readouterr().out
    assert "host text (transformer): 170,560 parameters" in out and "lora_large" in out and "64 x 64" in out
