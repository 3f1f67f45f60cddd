"""bench.host takes its timings in turns (a drift of the host hits every contender alike) and keeps
each one's fastest; the report's ratios are to the torch.add timed beside each row."""
import itertools

from bench import host as H
from bench import report


def test_in_turns_interleaves_the_contenders_and_keeps_each_ones_fastest(monkeypatch):
    order, times = [], itertools.cycle([5.0, 9.0, 3.0, 8.0, 4.0, 7.0])

    def fake_host_us(fn):
        order.append(fn())
        return next(times)
    monkeypatch.setattr(H, "host_us", fake_host_us)
    best = H.in_turns({"op": lambda: "op", "add": lambda: "add"})
    assert order == ["op", "add"] * H.ROUNDS
    assert best == {"op": 3.0, "add": 7.0}


def test_report_divides_each_row_by_its_own_torch_add():
    row = {"op": "compat x", "size": "1", "host_us": 12.0, "add_us": 8.0, "seed_host_us": 30.0}
    gen = {"op": "l.quantize", "size": "1", "host_us": 18.0, "add_us": 6.0, "seed_host_us": None}
    host = {"environment": {"device": "d", "torch": "t", "triton": "tr", "date": "x"}, "torch_add_us": 4.0,
            "results": [row, gen]}
    lines = report.compat_table(host)
    assert "| x | 1 | 30.0 | 12.0 | 1.50 |" in lines
    assert any("3.00-3.00x torch.add" in line and "over: l.quantize 3.00" in line for line in lines)
    del row["add_us"], gen["add_us"]                     # a run without paired timings: the run's torch.add
    assert "| x | 1 | 30.0 | 12.0 | 3.00 |" in report.compat_table(host)


def test_report_shows_the_earlier_build_beside_this_one_where_the_run_timed_it():
    compat = {"op": "compat x", "size": "1", "host_us": 12.0, "add_us": 8.0, "seed_host_us": 30.0,
              "against_host_us": 40.0}
    old = {"op": "l.quantize", "size": "1", "host_us": 18.0, "add_us": 6.0, "seed_host_us": None,
           "against_host_us": 24.0}
    new = {"op": "m.quantize", "size": "1", "host_us": 9.0, "add_us": 6.0, "seed_host_us": None}   # not in the old build
    host = {"environment": {"device": "d", "torch": "t", "triton": "tr", "date": "x"}, "torch_add_us": 4.0,
            "before": "the build abc", "results": [compat, old, new]}
    lines = report.compat_table(host)
    assert "| compat op | size | seed us | before us | kvlayout us | / torch.add |" in lines
    assert "| x | 1 | 30.0 | 40.0 | 12.0 | 1.50 |" in lines
    assert "Before: the build abc, timed in turns with this build." in lines[0]
    assert lines[-1].endswith("The 1 generated ops the build before has: 24.0-24.0 us, median 4.00x torch.add, "
                              "before; 18.0-18.0 us, median 3.00x, now.")


def test_report_sets_the_operator_rows_beside_the_direct_calls_and_out_of_the_target():
    direct = {"op": "l.gather_dequant", "size": "2", "host_us": 10.0, "add_us": 5.0, "seed_host_us": None}
    operator = {"op": H.OPERATOR + "l.gather_dequant", "size": "2", "host_us": 40.0, "add_us": 5.0, "seed_host_us": None}
    host = {"environment": {"device": "d", "torch": "t", "triton": "tr", "date": "x"}, "torch_add_us": 4.0,
            "results": [direct, operator]}
    assert report._op_ratios(host) == {"l.gather_dequant": 2.0}
    line = report._operator_line(host)[-1]
    assert "more: l.gather_dequant (2) 40.0 us, 8.00x torch.add, against 10.0 us called directly" in line
    assert report._operator_line({**host, "results": [direct]}) == []
