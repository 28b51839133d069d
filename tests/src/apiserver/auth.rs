//! Who is calling (bearer token or client certificate) and what they may do.
use std::collections::HashMap;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
}

/// One allow rule. "*" matches anything in each list.
#[derive(Debug, Clone)]
pub struct Rule {
    /// A user name or a group name.
    pub subject: String,
    pub verbs: Vec<String>,
    /// `pods`, `pods/log`, `leases`, ... (plural resource, optional /subresource).
    pub resources: Vec<String>,
    /// Namespaces; "" stands for cluster-scoped requests.
    pub namespaces: Vec<String>,
}

impl Rule {
    pub fn new(subject: &str, verbs: &[&str], resources: &[&str], namespaces: &[&str]) -> Self {
        let own = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
        Rule {
            subject: subject.into(),
            verbs: own(verbs),
            resources: own(resources),
            namespaces: own(namespaces),
        }
    }

    fn allows(&self, user: &User, verb: &str, resource: &str, namespace: &str) -> bool {
        let any = |list: &[String], v: &str| list.iter().any(|x| x == "*" || x == v);
        (self.subject == user.name || user.groups.contains(&self.subject))
            && any(&self.verbs, verb)
            && any(&self.resources, resource)
            && any(&self.namespaces, namespace)
    }
}

#[derive(Debug, Clone, Default)]
pub struct Auth {
    tokens: HashMap<String, User>,
    rules: Vec<Rule>,
    /// False models a kube-apiserver that has just started: its Node authorizer's graph
    /// is not built yet, so it has no opinion and RBAC alone decides.
    pub node_authorizer_ready: bool,
}

impl Auth {
    /// `system:masters` may do everything, like kube-apiserver's built-in superuser group.
    pub fn new() -> Self {
        Auth {
            tokens: HashMap::new(),
            rules: vec![Rule::new("system:masters", &["*"], &["*"], &["*"])],
            node_authorizer_ready: true,
        }
    }

    /// The identities test clusters use: token `pod-token` for the service account
    /// `default:app` (read pods, logs, configmaps, services, endpoints, endpointslices in
    /// `default`; write configmaps and exec there), and for the group `system:nodes` what
    /// deploy/base/hub.yaml grants on top of the Node authorizer (see `node_authz`).
    pub fn add_test_identities(&mut self) {
        let app = "system:serviceaccount:default:app";
        self.add_token("pod-token", app, &["system:serviceaccounts"]);
        let reads = [
            "pods",
            "pods/log",
            "configmaps",
            "services",
            "endpoints",
            "endpointslices",
        ];
        self.allow(Rule::new(
            app,
            &["get", "list", "watch"],
            &reads,
            &["default"],
        ));
        self.allow(Rule::new(
            app,
            &["create", "update", "patch"],
            &["configmaps", "pods/exec"],
            &["default"],
        ));
        // deploy/base/hub.yaml's hub:pool-leader: the pool-scope reads beyond the Node authorizer.
        self.allow(Rule::new(
            "system:nodes",
            &["get", "list", "watch"],
            &["services", "endpoints", "endpointslices"],
            &["*"],
        ));
    }

    pub fn add_token(&mut self, token: &str, user: &str, groups: &[&str]) {
        self.tokens.insert(
            token.to_string(),
            User {
                name: user.to_string(),
                groups: groups.iter().map(|g| g.to_string()).collect(),
            },
        );
    }

    pub fn allow(&mut self, rule: Rule) {
        self.rules.push(rule);
    }

    /// Takes back every rule for `subject` and returns them (a kube-apiserver that has
    /// just started answers 403 like this until its authorizer has loaded RBAC).
    pub fn revoke(&mut self, subject: &str) -> Vec<Rule> {
        let (gone, kept) = std::mem::take(&mut self.rules)
            .into_iter()
            .partition(|r| r.subject == subject);
        self.rules = kept;
        gone
    }

    pub fn user_for_token(&self, token: &str) -> Option<User> {
        self.tokens.get(token).cloned()
    }

    pub fn authorize(&self, user: &User, verb: &str, resource: &str, namespace: &str) -> bool {
        self.rules
            .iter()
            .any(|r| r.allows(user, verb, resource, namespace))
    }
}
