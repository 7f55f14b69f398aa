from esper_ray.cli import main


def test_host_command_lists_slots_and_blueprint_sizes(capsys):
    assert main(["host", "--task", "cifar10"]) == 0
    out = capsys.readouterr().out
    assert "host 6,418 parameters" in out and "r1c2" in out and "18,560" in out
