// kube-oracle writes Kubernetes objects as kube-apiserver encodes them, from Kubernetes' own
// Go types and serializers: random objects of every kind the hub converts, each in protobuf
// (the `k8s\0` envelope kube-apiserver stores and serves) and in JSON. The hub's converter is
// checked against them (tests/fixtures/kube-oracle).
//
//	kube-oracle SEED COUNT > samples.jsonl
//	kube-oracle decode < protobuf.b64 > objects.jsonl
//
// One line per object: {"apiVersion", "kind", "seed", "protobuf": base64, "json": object}.
// `decode` reads protobuf objects written by someone else (one base64 line each) the way
// kube-apiserver reads them from etcd, and writes each one's JSON (or {"error": ...}).
// Objects are filled by apimachinery's API fuzzer (the one k8s.io/api's round-trip tests use),
// so every field of every kind is set in some sample, zeros and empty lists included.
package main

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"sort"
	"strconv"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	networkingv1 "k8s.io/api/networking/v1"
	nodev1 "k8s.io/api/node/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/apitesting/fuzzer"
	"k8s.io/apimachinery/pkg/api/meta"
	genericfuzzer "k8s.io/apimachinery/pkg/apis/meta/fuzzer"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	jsonserializer "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
)

var groups = []runtime.SchemeBuilder{
	appsv1.SchemeBuilder, batchv1.SchemeBuilder, certificatesv1.SchemeBuilder,
	coordinationv1.SchemeBuilder, corev1.SchemeBuilder, discoveryv1.SchemeBuilder,
	eventsv1.SchemeBuilder, networkingv1.SchemeBuilder, nodev1.SchemeBuilder,
	policyv1.SchemeBuilder, rbacv1.SchemeBuilder, resourcev1.SchemeBuilder,
	schedulingv1.SchemeBuilder, storagev1.SchemeBuilder,
}

type sample struct {
	APIVersion string          `json:"apiVersion"`
	Kind       string          `json:"kind"`
	Seed       int64           `json:"seed"`
	Protobuf   string          `json:"protobuf"`
	JSON       json.RawMessage `json:"json"`
}

func main() {
	if len(os.Args) == 2 && os.Args[1] == "decode" {
		decode()
		return
	}
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: kube-oracle SEED COUNT")
		os.Exit(2)
	}
	seed, err1 := strconv.ParseInt(os.Args[1], 10, 64)
	count, err2 := strconv.Atoi(os.Args[2])
	if err1 != nil || err2 != nil {
		fmt.Fprintln(os.Stderr, "kube-oracle: SEED and COUNT are numbers")
		os.Exit(2)
	}
	scheme := newScheme()
	codecs := serializer.NewCodecFactory(scheme)
	pb := protobuf.NewSerializer(scheme, scheme)
	js := jsonserializer.NewSerializerWithOptions(jsonserializer.DefaultMetaFactory, scheme, scheme,
		jsonserializer.SerializerOptions{})

	var kinds []schema.GroupVersionKind
	for gvk := range scheme.AllKnownTypes() {
		obj, err := scheme.New(gvk)
		if err != nil {
			panic(err)
		}
		// Objects and their lists (what a node stores and reads), not request options or
		// the generic v1 List.
		_, object := obj.(metav1.Object)
		_, list := obj.(metav1.ListInterface)
		if gvk.Version == "v1" && (object || list) && gvk.Kind != "List" {
			kinds = append(kinds, gvk)
		}
	}
	sort.Slice(kinds, func(i, j int) bool { return kinds[i].String() < kinds[j].String() })

	out := json.NewEncoder(os.Stdout)
	for _, gvk := range kinds {
		for i := 0; i < count; i++ {
			s := seed*1000003 + int64(i)
			f := fuzzer.FuzzerFor(genericfuzzer.Funcs, rand.NewSource(s), codecs)
			obj, err := scheme.New(gvk)
			if err != nil {
				panic(err)
			}
			f.Fill(obj)
			obj.GetObjectKind().SetGroupVersionKind(gvk)
			var p, j bytes.Buffer
			if err := pb.Encode(obj, &p); err != nil {
				fmt.Fprintf(os.Stderr, "kube-oracle: %s: protobuf: %v\n", gvk, err)
				continue
			}
			// JSON as kube-apiserver serves it: the object decoded from its stored protobuf.
			back, _, err := pb.Decode(p.Bytes(), nil, nil)
			if err != nil {
				panic(fmt.Sprintf("%s: decode: %v", gvk, err))
			}
			asServed(back, gvk)
			if err := js.Encode(back, &j); err != nil {
				panic(err)
			}
			if err := out.Encode(sample{gvk.GroupVersion().String(), gvk.Kind, s,
				base64.StdEncoding.EncodeToString(p.Bytes()), bytes.TrimSpace(j.Bytes())}); err != nil {
				panic(err)
			}
		}
	}
}

// asServed makes a decoded object what kube-apiserver serves: its kind set, and a list's
// items a slice (`items: []` when empty, never null).
func asServed(obj runtime.Object, gvk schema.GroupVersionKind) {
	obj.GetObjectKind().SetGroupVersionKind(gvk)
	if items, err := meta.ExtractList(obj); err == nil && len(items) == 0 {
		if err := meta.SetList(obj, []runtime.Object{}); err != nil {
			panic(err)
		}
	}
}

func newScheme() *runtime.Scheme {
	scheme := runtime.NewScheme()
	for _, b := range groups {
		if err := b.AddToScheme(scheme); err != nil {
			panic(err)
		}
	}
	return scheme
}

func decode() {
	scheme := newScheme()
	pb := protobuf.NewSerializer(scheme, scheme)
	js := jsonserializer.NewSerializerWithOptions(jsonserializer.DefaultMetaFactory, scheme, scheme,
		jsonserializer.SerializerOptions{})
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 64<<20)
	for in.Scan() {
		var out bytes.Buffer
		raw, err := base64.StdEncoding.DecodeString(in.Text())
		var obj runtime.Object
		var gvk *schema.GroupVersionKind
		if err == nil {
			obj, gvk, err = pb.Decode(raw, nil, nil)
		}
		if err == nil {
			asServed(obj, *gvk)
			err = js.Encode(obj, &out)
		}
		if err != nil {
			msg, _ := json.Marshal(map[string]string{"error": err.Error()})
			fmt.Println(string(msg))
			continue
		}
		fmt.Println(string(bytes.TrimSpace(out.Bytes())))
	}
}
