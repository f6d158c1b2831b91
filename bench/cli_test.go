package bench

import (
	"flag"
	"io"
	"testing"
)

// TestParseFlags: -quick picks the quick defaults wherever it stands,
// flags given still win over them, and stray arguments are refused.
func TestParseFlags(t *testing.T) {
	type conf struct{ size, reps int }
	type opts struct{ quick bool }
	defaults := func(quick bool) conf {
		if quick {
			return conf{size: 1, reps: 1}
		}
		return conf{size: 100, reps: 3}
	}
	newFlags := func(c *conf, o *opts) *flag.FlagSet {
		fl := flag.NewFlagSet("t", flag.ContinueOnError)
		fl.SetOutput(io.Discard)
		fl.IntVar(&c.size, "size", c.size, "")
		fl.IntVar(&c.reps, "reps", c.reps, "")
		fl.BoolVar(&o.quick, "quick", false, "")
		return fl
	}
	parse := func(args ...string) (conf, opts, error) {
		return ParseFlags(args, defaults, newFlags, func(o *opts) bool { return o.quick }, func(c *conf) {})
	}
	for _, c := range []struct {
		args  []string
		want  conf
		quick bool
	}{
		{nil, conf{100, 3}, false},
		{[]string{"-quick"}, conf{1, 1}, true},
		{[]string{"-reps", "5", "-quick"}, conf{1, 5}, true},
		{[]string{"-size", "7"}, conf{7, 3}, false},
	} {
		got, o, err := parse(c.args...)
		if err != nil || got != c.want || o.quick != c.quick {
			t.Errorf("%q: %+v quick=%v %v, want %+v quick=%v", c.args, got, o.quick, err, c.want, c.quick)
		}
	}
	if _, _, err := parse("-quick", "extra"); err == nil {
		t.Error("a stray argument was accepted")
	}
	if _, _, err := parse("-nosuch"); err == nil {
		t.Error("an unknown flag was accepted")
	}
}
