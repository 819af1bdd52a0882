package yamlref_test

import (
	"strings"
	"testing"

	"github.com/kiln-build/kiln/internal/yamlref"
)

const agentDigest = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
const ctlDigest = "sha256:2222222222222222222222222222222222222222222222222222222222222222"

var pushed = map[string]yamlref.Pushed{
	"antrea/antrea-agent":      {Name: "reg.example:5000/antrea/antrea-agent", Tag: "v2.1.0", Digest: agentDigest},
	"antrea/antrea-controller": {Name: "reg.example:5000/antrea/antrea-controller", Tag: "v2.1.0", Digest: ctlDigest},
}

// A stream of several documents, comments, quoting, a Helm values mapping
// and references that are not the repository's: only the repository's
// references change, every other byte stays.
func TestResolveKeepsEveryOtherByte(t *testing.T) {
	in := `# The agent.
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: antrea-agent   # keep this comment
spec:
  template:
    spec:
      initContainers:
        - name: install
          image: "antrea/antrea-agent:latest"
      containers:
        - name: agent
          image: docker.io/antrea/antrea-agent:v1.0@sha256:0000000000000000000000000000000000000000000000000000000000000000
          args: ["--config", 'antrea/antrea-agent']
        - name: sidecar
          image: busybox:1.36   # not ours
---
apiVersion: apps/v1
kind: Deployment
spec:
  template:
    spec:
      containers:
      - {name: controller, image: 'antrea/antrea-controller'}
      - name: other
        image: other/antrea-controller:v1
---
# values.yaml
agent:
  image:
    repository: antrea/antrea-agent
    tag: latest
    pullPolicy: IfNotPresent
controller:
  image:
    repository: antrea/antrea-controller
    digest: ""
note: "ünïcode before antrea/antrea-controller on one line"
`
	want := `# The agent.
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: antrea-agent   # keep this comment
spec:
  template:
    spec:
      initContainers:
        - name: install
          image: "reg.example:5000/antrea/antrea-agent@` + agentDigest + `"
      containers:
        - name: agent
          image: reg.example:5000/antrea/antrea-agent@` + agentDigest + `
          args: ["--config", 'reg.example:5000/antrea/antrea-agent@` + agentDigest + `']
        - name: sidecar
          image: busybox:1.36   # not ours
---
apiVersion: apps/v1
kind: Deployment
spec:
  template:
    spec:
      containers:
      - {name: controller, image: 'reg.example:5000/antrea/antrea-controller@` + ctlDigest + `'}
      - name: other
        image: other/antrea-controller:v1
---
# values.yaml
agent:
  image:
    repository: reg.example:5000/antrea/antrea-agent
    tag: v2.1.0@` + agentDigest + `
    pullPolicy: IfNotPresent
controller:
  image:
    repository: reg.example:5000/antrea/antrea-controller
    digest: "` + ctlDigest + `"
note: "ünïcode before antrea/antrea-controller on one line"
`
	out, n, err := yamlref.Resolve([]byte(in), pushed)
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != want {
		t.Errorf("resolved:\n%s\nwant:\n%s", out, want)
	}
	if n != 6 {
		t.Errorf("pinned %d references, want 6", n)
	}
}

func TestResolveRefusesWhatItCannotRewriteInPlace(t *testing.T) {
	for name, in := range map[string]string{
		"escaped": "image: \"antrea/antrea\\x2Dagent:v1\"\n",
		"folded":  "image: >-\n  antrea/antrea-agent:v1\n",
	} {
		_, _, err := yamlref.Resolve([]byte(in), pushed)
		if err == nil || !strings.Contains(err.Error(), "line ") {
			t.Errorf("%s: err = %v, want one naming the line", name, err)
		}
	}
}

func TestResolveReportsBadYAML(t *testing.T) {
	_, _, err := yamlref.Resolve([]byte("a: [1, 2\nb: 3\n"), pushed)
	if err == nil {
		t.Fatal("no error for a broken stream")
	}
}

func TestResolveLeavesAFileWithoutReferences(t *testing.T) {
	in := "kind: ConfigMap\ndata:\n  image: busybox\n"
	out, n, err := yamlref.Resolve([]byte(in), pushed)
	if err != nil || n != 0 || string(out) != in {
		t.Fatalf("got %q, %d, %v", out, n, err)
	}
}

// Columns count characters, not bytes.
func TestResolveAfterWideCharacters(t *testing.T) {
	in := "{ünïcödé: x, image: antrea/antrea-agent}\n"
	want := "{ünïcödé: x, image: reg.example:5000/antrea/antrea-agent@" + agentDigest + "}\n"
	out, _, err := yamlref.Resolve([]byte(in), pushed)
	if err != nil || string(out) != want {
		t.Fatalf("got %q, %v; want %q", out, err, want)
	}
}

// Helm values as charts write them: an empty digest, a registry key.
func TestResolveHelmValuesShapes(t *testing.T) {
	in := "agent:\n  image:\n    repository: antrea/antrea-agent\n    digest:\n    tag: v1\n" +
		"controller:\n  image:\n    registry: docker.io\n    repository: antrea/antrea-controller\n    tag: v1\n"
	want := "agent:\n  image:\n    repository: reg.example:5000/antrea/antrea-agent\n    digest: " + agentDigest + "\n    tag: v1\n" +
		"controller:\n  image:\n    registry: reg.example:5000\n    repository: antrea/antrea-controller\n    tag: v2.1.0@" + ctlDigest + "\n"
	out, n, err := yamlref.Resolve([]byte(in), pushed)
	if err != nil || string(out) != want || n != 2 {
		t.Fatalf("got %d, %v:\n%s\nwant:\n%s", n, err, out, want)
	}
}

// An anchor or a tag before the value, and a byte order mark, stay.
func TestResolveKeepsAnchorsTagsAndTheByteOrderMark(t *testing.T) {
	in := "\uFEFFimage: antrea/antrea-agent\nfirst: &agent antrea/antrea-agent:v1\nsecond: *agent\nthird: !!str 'antrea/antrea-controller'\n"
	want := "\uFEFFimage: reg.example:5000/antrea/antrea-agent@" + agentDigest + "\nfirst: &agent reg.example:5000/antrea/antrea-agent@" + agentDigest +
		"\nsecond: *agent\nthird: !!str 'reg.example:5000/antrea/antrea-controller@" + ctlDigest + "'\n"
	out, _, err := yamlref.Resolve([]byte(in), pushed)
	if err != nil || string(out) != want {
		t.Fatalf("got %v:\n%q\nwant:\n%q", err, out, want)
	}
}
