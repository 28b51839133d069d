fn main() -> std::process::ExitCode {
    hub::cli::main()
}
