"""The suite's own isolation (tests/conftest.py): what one test leaves in the process does not
reach the next. These two run in this order (pytest keeps a file's order)."""


def test_a_logger_made_under_a_tests_capture(capsys):
    """mmengine's logger made here writes to capsys' stream, closed when this test ends."""
    from mmengine.logging import MMLogger
    MMLogger.get_instance('suite_isolation_logger', log_level='INFO')


def test_the_next_tests_current_logger_prints_without_a_logging_error(capfd):
    """(was: '--- Logging error --- ... I/O operation on closed file' on stderr)"""
    from mmengine.logging import print_log
    print_log('the current logger, after a test that made it', logger='current')
    assert 'Logging error' not in capfd.readouterr().err
