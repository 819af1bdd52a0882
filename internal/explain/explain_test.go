package explain

import (
	"slices"
	"testing"

	"github.com/kiln-build/kiln/internal/buildkit"
)

func TestExplainNamesTheInputThatChanged(t *testing.T) {
	prev := &Record{Inputs: Inputs{
		"link a": {"file a.go": "1", "file old.go": "1", "toolchain": "t"},
		"link b": {"file b.go": "1", "toolchain": "t"},
	}}
	now := Record{
		Inputs: Inputs{
			"link a":   {"file a.go": "2", "file new.go": "1", "toolchain": "t"},
			"link b":   {"file b.go": "1", "toolchain": "t"},
			"link c":   {"file c.go": "1"},
			"untraced": nil,
		},
		Steps: buildkit.Steps{{Name: "link a"}, {Name: "link b"}, {Name: "link c"}, {Name: "not tracked"}, {Name: "cached", Cached: true}},
	}
	now.Inputs["cached"] = map[string]string{"x": "1"}
	got := map[string][]string{}
	for _, e := range Explain(now, prev) {
		if e.Ran {
			got[e.Step] = e.Causes
		}
	}
	want := map[string][]string{
		"link a": {"file a.go changed", "file new.go added", "file old.go removed"},
		"link b": {"inputs unchanged: the daemon had no cached result (pruned, or another daemon)"},
		"link c": {"new step"},
	}
	for step, causes := range want {
		if !slices.Equal(got[step], causes) {
			t.Errorf("%s: causes %q, want %q", step, got[step], causes)
		}
	}
	if len(got) != len(want) {
		t.Errorf("explained %v; untracked and cached steps have no causes", got)
	}
	for _, e := range Explain(now, nil) {
		if e.Ran && !slices.Equal(e.Causes, []string{"no earlier build recorded"}) {
			t.Errorf("%s with no earlier record: %q", e.Step, e.Causes)
		}
	}
}

func TestExplainNamesTheStepWhoseDefinitionChanged(t *testing.T) {
	steps := buildkit.Steps{{Name: "link"}, {Name: "old record"}, {Name: "unnamed part"}}
	prev := &Record{Inputs: Inputs{
		"link":         {"step definition": "1", "definition of link": "l", "definition of [go] module layer": "m1"},
		"old record":   {"step definition": "1"},
		"unnamed part": {"step definition": "1", "definition of unnamed part": "u"},
	}}
	now := Record{Steps: steps, Inputs: Inputs{
		"link":         {"step definition": "2", "definition of link": "l", "definition of [go] module layer": "m2"},
		"old record":   {"step definition": "2", "definition of old record": "o"},
		"unnamed part": {"step definition": "2", "definition of unnamed part": "u"},
	}}
	want := map[string][]string{
		"link":         {"definition of [go] module layer changed"},
		"old record":   {"step definition changed"},
		"unnamed part": {"step definition changed"},
	}
	for _, e := range Explain(now, prev) {
		if !slices.Equal(e.Causes, want[e.Step]) {
			t.Errorf("%s: causes %q, want %q", e.Step, e.Causes, want[e.Step])
		}
	}
}
