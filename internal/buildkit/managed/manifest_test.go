package managed

import (
	"fmt"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// k8sManifest is build/k8s/buildkitd.yaml decoded into the Kubernetes API
// types.
type k8sManifest struct {
	configMaps  map[string]*corev1.ConfigMap
	services    map[string]*corev1.Service
	statefulSet *appsv1.StatefulSet
}

// yamlDocs splits a multi-document YAML file on its "---" lines and drops
// the documents that hold only comments.
func yamlDocs(dt []byte) []string {
	var docs []string
	var cur strings.Builder
	flush := func() {
		for l := range strings.Lines(cur.String()) {
			if l := strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
				docs = append(docs, cur.String())
				break
			}
		}
		cur.Reset()
	}
	for l := range strings.Lines(string(dt)) {
		if strings.TrimRight(l, " \t\r\n") == "---" {
			flush()
			continue
		}
		cur.WriteString(l)
	}
	flush()
	return docs
}

// decodeManifest decodes each document strictly (an unknown or duplicate
// field fails, and so does a wrong type) into the type its apiVersion and
// kind name: a ConfigMap, a Service or the one StatefulSet, nothing else.
func decodeManifest(dt []byte) (*k8sManifest, error) {
	m := &k8sManifest{configMaps: map[string]*corev1.ConfigMap{}, services: map[string]*corev1.Service{}}
	for i, doc := range yamlDocs(dt) {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			return nil, fmt.Errorf("document %d: %v", i, err)
		}
		var obj any
		switch tm.APIVersion + " " + tm.Kind {
		case "v1 ConfigMap":
			obj = &corev1.ConfigMap{}
		case "v1 Service":
			obj = &corev1.Service{}
		case "apps/v1 StatefulSet":
			obj = &appsv1.StatefulSet{}
		default:
			return nil, fmt.Errorf("document %d: unexpected kind %q of apiVersion %q", i, tm.Kind, tm.APIVersion)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			return nil, fmt.Errorf("document %d (%s): %v", i, tm.Kind, err)
		}
		dup := false
		switch o := obj.(type) {
		case *corev1.ConfigMap:
			dup = m.configMaps[o.Name] != nil
			m.configMaps[o.Name] = o
		case *corev1.Service:
			dup = m.services[o.Name] != nil
			m.services[o.Name] = o
		case *appsv1.StatefulSet:
			dup = m.statefulSet != nil
			m.statefulSet = o
		}
		if dup {
			return nil, fmt.Errorf("document %d: a second %s", i, tm.Kind)
		}
		if obj.(metav1.Object).GetName() == "" {
			return nil, fmt.Errorf("document %d (%s) has no metadata.name", i, tm.Kind)
		}
	}
	if m.statefulSet == nil || len(m.services) == 0 || len(m.configMaps) == 0 {
		return nil, fmt.Errorf("the manifest needs a StatefulSet, a Service and a ConfigMap")
	}
	return m, nil
}

// argValues are the values of a buildkitd flag: "--flag value" or
// "--flag=value".
func argValues(args []string, flag string) []string {
	var vs []string
	for i, a := range args {
		if a == flag && i+1 < len(args) {
			vs = append(vs, args[i+1])
		} else if v, ok := strings.CutPrefix(a, flag+"="); ok {
			vs = append(vs, v)
		}
	}
	return vs
}

// under reports whether file p lies in directory dir.
func under(p, dir string) bool {
	return strings.HasPrefix(path.Clean(p), path.Clean(dir)+"/")
}

// The sample Kubernetes deployment, a StatefulSet of buildkitd pods for a
// build spread over several daemons, decodes strictly into the Kubernetes
// API types, and its parts agree: the selectors, the headless Service, the
// spread over nodes, the volumes, the ConfigMap key the daemon reads, the
// port, the TLS files, and the buildkit release kiln pins.
func TestKubernetesManifest(t *testing.T) {
	dt, err := os.ReadFile("../../../build/k8s/buildkitd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m, err := decodeManifest(dt)
	if err != nil {
		t.Fatalf("build/k8s/buildkitd.yaml: %v", err)
	}

	// The decoding is strict: a misspelled field, a field given twice or a
	// wrong type in the StatefulSet fails it, though plain YAML takes each.
	var ssDoc string
	for _, doc := range yamlDocs(dt) {
		if strings.Contains(doc, "\nkind: StatefulSet\n") {
			ssDoc = doc
		}
	}
	if !strings.Contains(ssDoc, "\nspec:\n") {
		t.Fatal("no top-level spec: in the StatefulSet document to break")
	}
	for _, bad := range []struct{ field, want string }{
		{"  replica: 3\n", `unknown field "replica"`},
		{"  replicas: 2\n  replicas: 3\n", `"replicas" already set`},
		{"  minReadySeconds: soon\n", "cannot unmarshal string"},
	} {
		doc := strings.Replace(ssDoc, "\nspec:\n", "\nspec:\n"+bad.field, 1)
		var loose map[string]any
		if err := yaml.Unmarshal([]byte(doc), &loose); err != nil {
			t.Errorf("the StatefulSet with %q is not even YAML: %v", bad.field, err)
			continue
		}
		_, err := decodeManifest([]byte(strings.Replace(string(dt), ssDoc, doc, 1)))
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("the StatefulSet with %q: got error %v, want one saying %s", bad.field, err, bad.want)
		}
	}

	ss := m.statefulSet
	pod := ss.Spec.Template
	podLabels := labels.Set(pod.Labels)
	if len(podLabels) == 0 {
		t.Fatal("the StatefulSet's pod template has no labels")
	}
	sel, err := metav1.LabelSelectorAsSelector(ss.Spec.Selector)
	if err != nil || sel.Empty() || !sel.Matches(podLabels) {
		t.Errorf("the StatefulSet's selector %v (%v) does not match its pods' labels %v", ss.Spec.Selector, err, podLabels)
	}

	// A headless Service gives each pod the name buildkitd-N.<serviceName>.
	svc := m.services[ss.Spec.ServiceName]
	if svc == nil {
		t.Fatalf("the StatefulSet's serviceName %q names no Service in the manifest", ss.Spec.ServiceName)
	}
	if svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("Service %s has clusterIP %q, not None: pods get no name each", svc.Name, svc.Spec.ClusterIP)
	}
	if len(svc.Spec.Selector) == 0 || !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) {
		t.Errorf("Service %s's selector %v does not match the pods' labels %v", svc.Name, svc.Spec.Selector, podLabels)
	}

	// Several daemons, started together, on different nodes.
	if r := ss.Spec.Replicas; r == nil || *r < 2 {
		n := int32(1) // Kubernetes' default
		if r != nil {
			n = *r
		}
		t.Errorf("the StatefulSet runs %d replicas; a spread build wants 2 or more", n)
	}
	if ss.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		t.Errorf("podManagementPolicy is %q, not Parallel", ss.Spec.PodManagementPolicy)
	}
	var terms []corev1.PodAffinityTerm
	if a := pod.Spec.Affinity; a != nil && a.PodAntiAffinity != nil {
		terms = append(terms, a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution...)
		for _, w := range a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
			terms = append(terms, w.PodAffinityTerm)
		}
	}
	spread := false
	for _, term := range terms {
		s, err := metav1.LabelSelectorAsSelector(term.LabelSelector)
		if term.TopologyKey == corev1.LabelHostname && err == nil && !s.Empty() && s.Matches(podLabels) {
			spread = true
		}
	}
	if !spread {
		t.Errorf("no podAntiAffinity on %s selecting the pods themselves (%+v)", corev1.LabelHostname, terms)
	}

	if n := len(pod.Spec.Containers); n != 1 {
		t.Fatalf("the pod has %d containers, not 1", n)
	}
	c := pod.Spec.Containers[0]
	if !strings.HasSuffix(c.Image, ":"+Version) {
		t.Errorf("image %s is not buildkit %s, the version kiln pins", c.Image, Version)
	}
	if c.ReadinessProbe == nil || c.LivenessProbe == nil {
		t.Error("buildkitd has no readiness or no liveness probe")
	}

	// Volumes: every mount names one, the state has a claim per pod.
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		volumes[v.Name] = v
	}
	claims := map[string]bool{}
	for _, vct := range ss.Spec.VolumeClaimTemplates {
		claims[vct.Name] = true
		if q := vct.Spec.Resources.Requests[corev1.ResourceStorage]; q.IsZero() {
			t.Errorf("volumeClaimTemplate %s requests no storage", vct.Name)
		}
	}
	mounts := map[string]string{} // volume name -> mount path
	for _, vm := range c.VolumeMounts {
		_, isVolume := volumes[vm.Name]
		if !isVolume && !claims[vm.Name] {
			t.Errorf("volumeMount %s (%s) names no volume and no volumeClaimTemplate", vm.Name, vm.MountPath)
		}
		mounts[vm.Name] = vm.MountPath
	}
	stateMounted := false
	for name := range claims {
		stateMounted = stateMounted || mounts[name] == "/var/lib/buildkit"
	}
	if !stateMounted {
		t.Errorf("no volumeClaimTemplate is mounted at /var/lib/buildkit, buildkitd's state (mounts %v)", mounts)
	}

	// --config names a file the ConfigMap volume holds.
	configs := argValues(c.Args, "--config")
	if len(configs) != 1 {
		t.Fatalf("buildkitd args %v give --config %d times, not once", c.Args, len(configs))
	}
	configFound := false
	for _, v := range pod.Spec.Volumes {
		if v.ConfigMap == nil {
			continue
		}
		cm := m.configMaps[v.ConfigMap.Name]
		if cm == nil {
			t.Errorf("volume %s names ConfigMap %q, which the manifest lacks", v.Name, v.ConfigMap.Name)
			continue
		}
		files := map[string]string{} // path in the volume -> key
		if len(v.ConfigMap.Items) == 0 {
			for k := range cm.Data {
				files[k] = k
			}
		}
		for _, it := range v.ConfigMap.Items {
			if _, ok := cm.Data[it.Key]; !ok {
				t.Errorf("volume %s mounts key %q, which ConfigMap %s lacks", v.Name, it.Key, cm.Name)
			}
			files[it.Path] = it.Key
		}
		if dir, ok := mounts[v.Name]; ok && under(configs[0], dir) {
			key, ok := files[strings.TrimPrefix(path.Clean(configs[0]), path.Clean(dir)+"/")]
			if !ok {
				t.Errorf("--config %s is not a file of volume %s (%v)", configs[0], v.Name, files)
			} else if data, ok := cm.Data[key]; ok && strings.TrimSpace(data) == "" {
				t.Errorf("ConfigMap %s's key %s, the daemon's --config, is empty", cm.Name, key)
			} else {
				configFound = true
			}
		}
	}
	if !configFound {
		t.Errorf("--config %s is in no mounted ConfigMap", configs[0])
	}

	// The TCP port: the container's and the Service's.
	var port int32
	for _, addr := range argValues(c.Args, "--addr") {
		if rest, ok := strings.CutPrefix(addr, "tcp://0.0.0.0:"); ok {
			p, err := strconv.ParseInt(rest, 10, 32)
			if err != nil {
				t.Fatalf("--addr %s: %v", addr, err)
			}
			port = int32(p)
		}
	}
	if port == 0 {
		t.Fatalf("buildkitd args %v have no --addr tcp://0.0.0.0:PORT", c.Args)
	}
	// kube-pod:// (buildctl dial-stdio) and the probes use the default socket.
	if !slices.Contains(argValues(c.Args, "--addr"), "unix:///run/buildkit/buildkitd.sock") {
		t.Errorf("buildkitd args %v lack --addr unix:///run/buildkit/buildkitd.sock, which kube-pod:// and the probes dial", c.Args)
	}
	containerPorts := map[string]int32{}
	for _, p := range c.Ports {
		if p.Name != "" {
			containerPorts[p.Name] = p.ContainerPort
		}
		containerPorts[strconv.Itoa(int(p.ContainerPort))] = p.ContainerPort
	}
	if _, ok := containerPorts[strconv.Itoa(int(port))]; !ok {
		t.Errorf("the container declares ports %v, not %d of --addr", c.Ports, port)
	}
	servesPort := false
	for _, sp := range svc.Spec.Ports {
		target := sp.TargetPort
		if target == (intstr.IntOrString{}) {
			target = intstr.FromInt32(sp.Port)
		}
		if sp.Port == port && containerPorts[target.String()] == port {
			servesPort = true
		}
	}
	if !servesPort {
		t.Errorf("Service %s's ports %v do not serve %d to the container's %d", svc.Name, svc.Spec.Ports, port, port)
	}

	// Mutual TLS, from files of a mounted secret.
	for _, flag := range []string{"--tlscacert", "--tlscert", "--tlskey"} {
		vs := argValues(c.Args, flag)
		if len(vs) != 1 {
			t.Errorf("buildkitd args %v give %s %d times, not once", c.Args, flag, len(vs))
			continue
		}
		inSecret := false
		for _, v := range pod.Spec.Volumes {
			if dir, ok := mounts[v.Name]; ok && v.Secret != nil && under(vs[0], dir) {
				inSecret = true
			}
		}
		if !inSecret {
			t.Errorf("%s %s is in no mounted secret", flag, vs[0])
		}
	}
}
