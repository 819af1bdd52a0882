package image_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moby/buildkit/client/llb"
	"github.com/moby/buildkit/solver/pb"

	"github.com/kiln-build/kiln/internal/image"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

// TestGraphGolden renders every vertex of this repository's build graph as
// text, so a reviewer sees each change to the graph in a diff. Keys that
// name the machine (local source ids) are left out; the source date is fixed.
// Run `go test ./internal/image -run Golden -update` after an intended change.
func TestGraphGolden(t *testing.T) {
	t.Setenv("SOURCE_DATE_EPOCH", "1700000000")
	p := testPlan(t, "linux/amd64,linux/arm64")
	g := image.NewGraph(p, nil, nil)
	rendered := map[string]string{}
	for _, img := range p.Images {
		for _, st := range g.States(img) {
			collect(t, st, rendered)
		}
	}
	var out strings.Builder
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range rendered {
			if !yield(k) {
				return
			}
		}
	}) {
		out.WriteString(rendered[name])
	}
	golden := filepath.Join("testdata", "graph.golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(golden, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got := out.String(); got != string(want) {
		t.Errorf("the build graph changed; if that is intended, run go test ./internal/image -run Golden -update and review the diff of %s\n%s", golden, firstDifference(string(want), got))
	}
}

func collect(t *testing.T, st llb.State, into map[string]string) {
	t.Helper()
	def, err := st.Marshal(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, dt := range def.Def {
		var op pb.Op
		if err := op.UnmarshalVT(dt); err != nil {
			t.Fatal(err)
		}
		name := def.Metadata[digestOf(dt)].Description["llb.customname"]
		if name == "" && op.GetSource() == nil && op.GetExec() == nil && op.GetFile() == nil {
			continue // the terminal vertex
		}
		into[name+"\x00"+render(&op)] = name + "\n" + render(&op) + "\n"
	}
}

func render(op *pb.Op) string {
	var b strings.Builder
	if pl := op.Platform; pl != nil {
		fmt.Fprintf(&b, "  platform %s/%s%s\n", pl.OS, pl.Architecture, pl.Variant)
	}
	switch {
	case op.GetSource() != nil:
		src := op.GetSource()
		fmt.Fprintf(&b, "  source %s\n", src.Identifier)
		for _, k := range slices.Sorted(mapKeys(src.Attrs)) {
			if k == "local.unique" {
				continue
			}
			fmt.Fprintf(&b, "    %s=%s\n", k, src.Attrs[k])
		}
	case op.GetExec() != nil:
		e := op.GetExec()
		fmt.Fprintf(&b, "  exec %s\n  network %s\n", strings.Join(e.Meta.Args, " "), e.Network)
		for _, kv := range e.Meta.Env {
			fmt.Fprintf(&b, "    env %s\n", kv)
		}
		for _, m := range e.Mounts {
			kind := m.MountType.String()
			if m.CacheOpt != nil {
				kind += " id=" + m.CacheOpt.ID + " " + m.CacheOpt.Sharing.String()
			}
			fmt.Fprintf(&b, "    mount %s %s readonly=%t\n", m.Dest, kind, m.Readonly)
		}
	case op.GetFile() != nil:
		for _, a := range op.GetFile().Actions {
			switch {
			case a.GetCopy() != nil:
				c := a.GetCopy()
				fmt.Fprintf(&b, "  copy %s -> %s include=%v\n", c.Src, c.Dest, c.IncludePatterns)
			case a.GetMkfile() != nil:
				f := a.GetMkfile()
				fmt.Fprintf(&b, "  mkfile %s %o %d bytes\n", f.Path, f.Mode, len(f.Data))
			case a.GetMkdir() != nil:
				d := a.GetMkdir()
				fmt.Fprintf(&b, "  mkdir %s %o\n", d.Path, d.Mode)
			default:
				fmt.Fprintf(&b, "  file action %T\n", a.Action)
			}
		}
	}
	return b.String()
}

func mapKeys(m map[string]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func firstDifference(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < len(w) || i < len(g); i++ {
		var a, b string
		if i < len(w) {
			a = w[i]
		}
		if i < len(g) {
			b = g[i]
		}
		if a != b {
			return fmt.Sprintf("line %d:\n want %q\n  got %q", i+1, a, b)
		}
	}
	return ""
}
