"""``secureflhv predict``: the prediction job file derived from a training job (no network)."""
from __future__ import annotations

from secureflhv.cli import main
from secureflhv.runtime.job.load import load_job, load_job_params
from secureflhv.runtime.job.demo import write_vertical_lr_job


def test_predict_writes_a_valid_prediction_job(tmp_path, capsys):
    (tmp_path / "g.csv").write_text("id,label,a\nu1,0,1\nu2,1,2\n")
    (tmp_path / "h.csv").write_text("id,b\nu1,1\nu2,2\n")
    train = write_vertical_lr_job(tmp_path / "train", tmp_path / "g.csv", [tmp_path / "h.csv"], {"epochs": 1})
    (tmp_path / "new.csv").write_text("id,label,a\nu3,0,1\n")
    out = tmp_path / "elsewhere" / "predict.yaml"
    assert main(["predict", str(train), "--data", f"guest={tmp_path / 'new.csv'}", "--out", str(out)]) == 0
    cfg, params = load_job_params(out)
    trained = load_job(train)
    assert cfg.job.algorithm == "predict" and cfg.job.id == "vertical-lr-demo-predict"
    assert params.model_job_id == "vertical-lr-demo" and cfg.resolve(params.model_dir) == trained.resolve(trained.job.output_dir)
    assert cfg.resolve(cfg.party("guest").data.path) == tmp_path / "new.csv"
    assert cfg.resolve(cfg.party("host-1").data.path) == trained.resolve(trained.party("host-1").data.path)
    assert cfg.resolve(cfg.security.ca) == trained.resolve(trained.security.ca)  # same certificates, moved paths
    assert [p.address for p in cfg.parties] == [p.address for p in trained.parties]
    assert "secureflhv run" in capsys.readouterr().out
    assert main(["predict", str(train), "--data", "nobody=x.csv", "--out", str(out)]) == 2
    assert "not parties of" in capsys.readouterr().err
